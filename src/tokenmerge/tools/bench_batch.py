"""What matching every sample on its own costs against one matching shared by the batch (``tome``, per step).

``python -m tokenmerge.tools.bench_batch``: Flux.1 (first blocks at full width, 1024 px) and Wan 2.1 1.3B (first
block at full width, 480x832 px x 17 frames), ToMe r=0.5 at batch 2 and 4: vanilla, per-sample plans (tokenmerge's
only behaviour since every image of a batch became independent of the others) and one plan for the batch (the
fallback ``PatchState.shared_plans``, what those families did before), interleaved with the order rotated every round;
median seconds per forward (min-max) and the counted multiply-adds (:mod:`tokenmerge.tools.work`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from .. import apply_patch, remove_patch
from ..hooks import states_in
from .architectures import build_model, transformer_inputs, transformer_output
from .work import count

CASES = {"flux": dict(latent=(128, 128), frames=None, blocks=1), "wan": dict(latent=(60, 104), frames=5, blocks=1)}


def _variants(model: torch.nn.Module) -> dict[str, Any]:
    def patch(shared: bool) -> None:
        apply_patch(model, ratio=0.5)
        for _, state in states_in([model]):
            state.shared_plans = shared

    return {"vanilla": lambda: remove_patch(model), "per sample": lambda: patch(False), "shared by the batch": lambda: patch(True)}


def bench(name: str, batches: tuple[int, ...], repeats: int) -> list[dict[str, Any]]:
    case = CASES[name]
    model = build_model(name, blocks=case["blocks"])
    rows = []
    for batch in batches:
        inputs = transformer_inputs(model, name, *case["latent"], batch=batch, frames=case["frames"])
        variants = _variants(model)
        times: dict[str, list[float]] = {v: [] for v in variants}
        macs: dict[str, int] = {}
        order = list(variants)
        with torch.inference_mode():
            for label in order:  # warm-up, and the counted work
                variants[label]()
                macs[label] = count(lambda inputs=inputs: transformer_output(name, model(**inputs))).total
            for r in range(repeats):
                for label in order[r % len(order) :] + order[: r % len(order)]:
                    variants[label]()
                    start = time.perf_counter()
                    transformer_output(name, model(**inputs))
                    times[label].append(time.perf_counter() - start)
        remove_patch(model)
        base = statistics.median(times["vanilla"])
        for label in order:
            median = statistics.median(times[label])
            rows.append(
                dict(
                    model=name,
                    batch=batch,
                    variant=label,
                    median=median,
                    low=min(times[label]),
                    high=max(times[label]),
                    speedup=base / median,
                    gmacs=macs[label] / 1e9,
                )
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tokenmerge.tools.bench_batch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--batches", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"{torch.get_num_threads()} threads, fp32, ToMe r=0.5, {args.repeats} rounds (medians, min-max)\n")
    print("| model | batch | plans | s / forward | speed-up | GMACs |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        for row in bench(name, tuple(args.batches), args.repeats):
            print(
                f"| {row['model']} | {row['batch']} | {row['variant']} | {row['median']:.2f} ({row['low']:.2f}-{row['high']:.2f}) "
                f"| {row['speedup']:.2f}x | {row['gmacs']:.1f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
