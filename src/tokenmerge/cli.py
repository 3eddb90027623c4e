"""Command line: ``tokenmerge bench`` (speed and fidelity on a built-in SD architecture)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch


def _bench(args: argparse.Namespace) -> int:
    from .bench import format_table, rows_to_json, run_bench

    if args.threads:
        torch.set_num_threads(args.threads)
    rows = run_bench(
        model=args.model,
        sizes_px=tuple(args.sizes),
        batch=args.batch,
        repeats=args.repeats,
        ratio=args.ratio,
        seed=args.seed,
        small=args.small,
        log=lambda msg: print(msg, file=sys.stderr),
    )
    print(format_table(rows, args.model, args.batch))
    if args.json:
        Path(args.json).write_text(rows_to_json(rows, model=args.model, batch=args.batch, threads=torch.get_num_threads(), torch=torch.__version__))
    return 0


def _positive_size(value: str) -> int:
    size = int(value)
    if size < 64 or size % 64:
        raise argparse.ArgumentTypeError(f"sizes must be multiples of 64 px (>= 64), got {value}")
    return size


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenmerge", description="Token Merging for Stable Diffusion.")
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser(
        "bench",
        help="time vanilla / tomesd / tokenmerge UNet forwards on a built-in architecture (random weights)",
        description="Builds the SD UNet architecture from its config with random weights (no download) and times "
        "one UNet forward per variant, interleaved, reporting medians, speed-up and fidelity to vanilla.",
    )
    bench.add_argument("--model", choices=("sd15", "sd21", "sdxl"), default="sd15")
    bench.add_argument("--sizes", type=_positive_size, nargs="+", default=[512], help="image sizes in px (latent = px/8); default 512")
    bench.add_argument("--batch", type=int, default=2, help="batch size (2 = one image with classifier-free guidance)")
    bench.add_argument("--repeats", type=int, default=2, help="timed forwards per variant and size (after one warm-up)")
    bench.add_argument("--ratio", type=float, default=0.5)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    bench.add_argument("--small", action="store_true", help="narrow variant of the architecture (smoke tests)")
    bench.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    bench.set_defaults(func=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
