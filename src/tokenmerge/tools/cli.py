"""Command line: ``tokenmerge bench`` (speed and fidelity on built-in architectures), ``tokenmerge eval`` (image
quality on the trained reference models or a local pipeline), ``tokenmerge describe`` (what a patch does to a
family's model or a diffusers folder, block by block, at a size), ``tokenmerge train-reference`` and ``tokenmerge
support`` (the support matrix from the family registry)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import torch

from ..config import DEFAULTS
from .architectures import BENCH_NOISE, TRANSFORMERS, UNETS
from .distilled import SCHEDULES
from .progress import progress_bar


def _bench(args: argparse.Namespace) -> int:
    from .bench import default_specs, describe_model, format_table, plot_speedups, rows_to_json, run_bench, run_comfy_bench
    from .specs import PatchSpec

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.schedule:
        _few_step_defaults(args)
    batch_given = args.batch is not None
    args.model, args.sizes, args.batch = args.model or "sd15", args.sizes or [768], args.batch or 2
    common = dict(sizes_px=tuple(args.sizes), batch=args.batch, repeats=args.repeats, seed=args.seed, small=args.small)
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    if args.beside_diffusers and not (args.comfyui and args.model in TRANSFORMERS):
        raise SystemExit("tokenmerge bench: error: --beside-diffusers goes with --comfyui --model <a transformer>")
    if args.cp:
        return _bench_context_parallel(args)
    if args.comfyui and args.model in TRANSFORMERS:
        from .bench import run_comfy_dit_bench

        if args.compile or args.device != "cpu":
            raise SystemExit("tokenmerge bench: error: --comfyui runs ComfyUI's own model on the CPU; drop --compile/--device")
        if args.batch not in (1, 2) or (args.steps and args.batch != 1 and batch_given):
            raise SystemExit(
                "tokenmerge bench: error: --comfyui on a transformer samples at CFG 2 (--batch 2, the default: both halves in one "
                "call) or CFG 1 (--batch 1); its --steps loops at CFG 1 (--batch 1)"
            )
        args.batch = 1 if args.steps else args.batch
        attention = "pytorch" if args.comfy_attention == "default" else args.comfy_attention
        try:
            rows = run_comfy_dit_bench(
                args.model,
                tuple(args.sizes),
                args.repeats,
                tuple(args.variants or ("todo:2", "auto")),
                args.blocks or 1,
                tuple(args.frames),
                attention,
                steps=args.steps,
                cfg=float(args.batch),
                beside_diffusers=args.beside_diffusers,
                log=log,
            )
        except ValueError as error:
            raise SystemExit(f"tokenmerge bench: error: {error}") from error
        label = f"ComfyUI {args.model} (its own classes, first {args.blocks or 1} block(s) at full width, {attention} attention)"
        label += f", CFG {args.batch} (one call of batch {args.batch} per step)"
        if args.steps:
            label += f", whole KSampler loops of {args.steps} euler steps"
        if args.beside_diffusers:
            label += "; beside it the diffusers path's model (rows 'diffusers ...', one forward of the same batch, each against diffusers vanilla)"
    elif args.comfyui:
        if args.model != "sd15" or args.variants or args.compile or args.device != "cpu" or args.blocks:
            raise SystemExit(
                "tokenmerge bench: error: --comfyui runs ComfyUI's SD 1.5 UNet on the CPU with fixed rows; drop --model/--variants/--compile/--device/--blocks"
            )
        rows = run_comfy_bench(**common, ratio=args.ratio, attention=args.comfy_attention, log=log)
        label = f"ComfyUI sd15 UNet ({args.comfy_attention} attention)"
    else:
        try:
            specs = [PatchSpec.parse(s) for s in args.variants] if args.variants else default_specs(args.ratio, args.model)
        except (ValueError, TypeError) as error:
            raise SystemExit(f"tokenmerge bench: error: --{'variants' if args.variants else 'ratio'}: {error}") from error
        dtype = getattr(torch, args.dtype)
        try:
            rows = run_bench(
                model=args.model,
                **common,
                specs=specs,
                device=args.device,
                dtype=dtype,
                compile=args.compile,
                blocks=args.blocks,
                steps=args.steps,
                frames=tuple(args.frames),
                schedule=args.schedule,
                log=log,
            )
        except ValueError as error:
            raise SystemExit(f"tokenmerge bench: error: {error}") from error
        label = (
            f"{describe_model(args.model, args.small, args.blocks)}, {args.dtype}{f', compiled ({args.compile})' if args.compile else ''}"
        )
        if args.schedule:
            label += f", whole sampling loops of {args.schedule}'s {args.steps} steps (its pipeline's scheduler, no CFG)"
        elif args.steps and args.model in UNETS:
            label += f", whole sampling loops of {args.steps} DDIM steps (CFG)"
        elif args.steps:
            label += f", whole sampling loops of {args.steps} flow-matching Euler steps"
        else:
            label += f", one denoising step at noise level {BENCH_NOISE:g}"
    rounds = None if args.comfyui else args.repeats
    print(format_table(rows, label, args.batch, args.device, timed="run" if args.steps else "forward", rounds=rounds))
    meta = dict(
        model=label, batch=args.batch, threads=torch.get_num_threads(), torch=torch.__version__, device=args.device, argv=sys.argv[1:]
    )
    if args.json:
        Path(args.json).write_text(rows_to_json(rows, **meta))
    if args.plot:
        plot_speedups(rows, args.plot, f"{label}, batch {args.batch}, {args.device}")
    return 0


def _few_step_defaults(args: argparse.Namespace) -> None:
    """--schedule NAME: the published few-step model's architecture, steps, default size and one call per step (no
    CFG) where not given; a conflicting --model or --steps is an error."""
    from .distilled import schedule_named

    try:
        plan = schedule_named(args.schedule)
    except ValueError as error:
        raise SystemExit(f"tokenmerge bench: error: --schedule: {error}") from error
    if args.model not in (None, plan.model) or args.steps not in (0, plan.steps) or args.comfyui or args.cp:
        raise SystemExit(
            f"tokenmerge bench: error: --schedule {args.schedule} runs {plan.model} in {plan.steps} diffusers steps; drop --model/--steps/--comfyui/--cp"
        )
    args.model, args.steps, args.batch = plan.model, plan.steps, args.batch or 1
    if not args.sizes:
        size = plan.size
        args.sizes = [size if isinstance(size, int) else size[:2]]
        if not isinstance(size, int) and not args.frames:
            args.frames = [size[2]]


def _bench_context_parallel(args: argparse.Namespace) -> int:
    """``bench --cp N``: per-rank forward time and attention traffic under Ulysses context parallelism."""
    import json

    from .bench import describe_model
    from .context_parallel import bench_family, format_bench, run_ranks
    from .specs import PatchSpec

    if args.comfyui or args.compile or args.schedule or args.device != "cpu" or args.model in UNETS or len(args.sizes) != 1:
        raise SystemExit(
            "tokenmerge bench: error: --cp runs one transformer at one --sizes on the CPU; drop --comfyui/--compile/--schedule/--device"
        )
    specs = tuple(args.variants or ("todo:2", "auto", "tome:0.5"))
    for spec in specs:
        PatchSpec.parse(spec)
    size = args.sizes[0]
    height, width = (size, size) if isinstance(size, int) else size
    frames = args.frames[0] if args.frames else None
    latent = (height // 8, width // 8)
    rows = run_ranks(
        bench_family,
        args.model,
        *latent,
        specs,
        frames,
        args.repeats,
        args.small,
        args.blocks,
        max(1, args.steps or 1),
        world=args.cp,
        threads=args.threads or 1,
        timeout=3600,
    )
    label = f"{describe_model(args.model, args.small, args.blocks)}, {height}x{width} px" + (f", {frames} latent frames" if frames else "")
    print(format_bench(rows, label, args.cp, args.steps or 1))
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": {"model": label, "world": args.cp, "argv": sys.argv[1:]}, "rows": rows}, indent=1))
    return 0


def _eval(args: argparse.Namespace) -> int:
    from .evaluate import (
        ReferenceSampler,
        default_configs,
        format_paired,
        format_results,
        make_sampler,
        nearest_class_accuracy,
        paired_against,
        results_json,
        run_eval,
        save_frontier,
        save_grid,
        structure_table,
    )
    from .specs import PatchSpec

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        sampler = make_sampler(args.model, args.size, args.steps, args.guidance, args.frames)
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"tokenmerge eval: error: {error}") from error
    kind = sampler.model.kind if isinstance(sampler, ReferenceSampler) else None
    checks = isinstance(sampler, ReferenceSampler)  # the photograph checks after sampling: said now if they cannot run
    if checks:
        from .reference.photos import install_command, missing

        absent = missing()
        if absent:
            checks = False
            print(
                "tokenmerge eval: the nearest-class check and the attention-structure table need the photographs that ship "
                f"in {', '.join(sorted(absent))}; they are skipped (install them with: {install_command(absent)})",
                file=sys.stderr,
            )
    try:
        configs = [PatchSpec.parse(spec) for spec in args.configs] if args.configs else default_configs(kind)
    except (ValueError, TypeError) as error:
        raise SystemExit(f"tokenmerge eval: error: --configs: {error}") from error
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    bar = progress_bar((len(seeds) + 1) * (len(configs) + 1), "eval")  # + one counted generation each
    results, images = run_eval(configs, seeds, sampler, sampler.target, progress=(lambda: bar.update(1)) if bar else (lambda: None))
    if bar:
        bar.close()
    header = f"{sampler.describe()}, {len(seeds)} seeds{f' ({seeds[0]}-{seeds[-1]})' if args.first_seed else ''}, {torch.get_num_threads()} threads"
    print(format_results(results, header))
    extra: dict = {}
    if args.baseline:
        baseline = PatchSpec.parse(args.baseline).name
        try:
            paired = paired_against(results, baseline)
        except ValueError as error:
            raise SystemExit(f"tokenmerge eval: error: {error}") from error
        print(format_paired(paired))
        extra["paired"] = paired
    frames = {"frames": sampler.frames} if getattr(sampler, "frames", 0) else {}
    meta = dict(model=args.model or "unet", size=sampler.size, steps=sampler.steps, seeds=len(seeds), first_seed=args.first_seed, **frames)

    def write_json() -> None:
        if args.json:
            Path(args.json).write_text(results_json(results, **meta, **extra))

    write_json()  # the computed results first: nothing after may lose them
    if args.grid:
        save_grid(images, args.grid)
    if args.frontier:
        save_frontier(results, args.frontier, header, highlight=tuple(PatchSpec.parse(h).name for h in args.label))
    if checks:
        accuracy = nearest_class_accuracy(images["vanilla"], [sampler.label(s) for s in seeds], sampler.model.class_names)
        extra["vanilla_nearest_class_accuracy"] = accuracy
        print(
            f"vanilla samples whose nearest training crop is from their own photograph: {accuracy:.0%} (chance {1 / sampler.model.num_classes:.0%})"
        )
        write_json()
        if args.structure:
            print(structure_table(sampler))
    return 0


def _train(args: argparse.Namespace) -> int:
    from .reference.card import finish
    from .reference.train import TrainConfig, train

    if args.threads:
        torch.set_num_threads(args.threads)
    log = lambda *a, **k: print(*a, **k, file=sys.stderr)  # noqa: E731
    out = args.out or f"runs/{args.kind}"
    if not args.finish_only:
        config = TrainConfig(
            kind=args.kind,
            out=out,
            hours=args.hours,
            steps=args.steps or TrainConfig().steps,
            batch=args.batch,
            lr=args.lr,
            seed=args.seed,
            structure_every=args.structure_every,
            max_images=args.max_images,
            crop_scale=tuple(args.crop_scale),
            ema=args.ema,
            res=args.res,
            frames=args.frames,
            init_from=args.init_from,
        )
        train(config, log=log)
    if args.finish:
        finish(Path(out), log=log)
    return 0


def _distill(args: argparse.Namespace) -> int:
    from .reference.distill import DistillConfig, distill, finish

    if args.threads:
        torch.set_num_threads(args.threads)
    log = lambda *a, **k: print(*a, **k, file=sys.stderr)  # noqa: E731
    if not args.finish_only:
        config = DistillConfig(
            out=args.out,
            teacher=args.teacher,
            trajectories=args.trajectories,
            hours=args.hours,
            steps=args.steps or DistillConfig().steps,
            batch=args.batch,
            lr=args.lr,
            seed=args.seed,
        )
        distill(config, log=log)
    if args.finish:
        finish(Path(args.out), log=log)
    return 0


def _support(args: argparse.Namespace) -> int:
    from .support import matrix, write_readme

    if args.write_readme:
        print(f"{args.write_readme}: {'updated' if write_readme(args.write_readme) else 'already current'}")
        return 0
    print(matrix(notes=args.notes))
    return 0


def _generated_table(module: str, args: argparse.Namespace) -> int:
    """A docs table made by ``module`` (its ``table`` and ``write_docs``): printed, or written between a page's markers."""
    import importlib

    found = importlib.import_module(f".{module}", __package__)
    if args.write_docs:
        print(f"{args.write_docs}: {'updated' if found.write_docs(args.write_docs) else 'already current'}")
        return 0
    print(found.table())
    return 0


def _frontier(args: argparse.Namespace) -> int:
    from .evaluate import save_work_frontier
    from .specs import PatchSpec

    files = [json.loads(Path(f).read_text()) for f in args.files]
    save_work_frontier(files, args.out, highlight=tuple(PatchSpec.parse(h).name for h in args.label))
    print(f"wrote {args.out}")
    return 0


def _describe(args: argparse.Namespace) -> int:
    """``tokenmerge describe MODEL``: a family's published architecture (built on the meta device: no memory, no
    download) or a local diffusers folder's (its configs only), patched with ``--config``, described at a size."""
    from .. import apply_patch, describe
    from .architectures import meta_model, meta_pipeline
    from .specs import PatchSpec

    try:
        spec = PatchSpec.parse(args.config)
        if spec.method in ("tomesd", "none") or spec.accelerators:
            raise ValueError(f"--config is a tokenmerge configuration (tome, todo or auto, with options), got {args.config!r}")
        if Path(args.model).is_dir():
            target = meta_pipeline(args.model)
        elif args.steps:
            raise ValueError("--steps counts a pipeline's scheduler steps: give a diffusers folder, not a model family")
        else:
            target = meta_model(args.model)
        apply_patch(target, **spec.kwargs())
        size = args.size if isinstance(args.size, tuple) else (args.size, args.size)
        print(describe(target, size=size, frames=args.frames, steps=args.steps or None))
    except (ValueError, TypeError, FileNotFoundError) as error:
        raise SystemExit(f"tokenmerge describe: error: {error}") from error
    return 0


def _positive_size(value: str) -> int | tuple[int, int]:
    """A square side (1024) or, for video models, height x width (480x832): px, multiples of 16."""
    try:
        sides = [int(v) for v in value.lower().split("x")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes are px like 1024 or 480x832, got {value}") from None
    if len(sides) == 1:
        if sides[0] < 64 or sides[0] % 64:
            raise argparse.ArgumentTypeError(f"sizes must be multiples of 64 px (>= 64), got {value}")
        return sides[0]
    if len(sides) != 2 or min(sides) < 16 or any(s % 16 for s in sides):
        raise argparse.ArgumentTypeError(f"a height x width size must be two multiples of 16 px, got {value}")
    return sides[0], sides[1]


# The reference models and their training code come with the repository, not the wheel (pyproject's exclude).
REFERENCE = importlib.util.find_spec("tokenmerge.tools.reference") is not None
NO_REFERENCE = (
    "the reference models and their training code come with tokenmerge's repository, not its wheel: clone it and "
    'install it from there (pip install -e ".[eval]", as its README says)'
)


def _no_reference(args: argparse.Namespace) -> int:
    raise SystemExit(f"tokenmerge {args.command}: error: {NO_REFERENCE}")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="tokenmerge",
        description="Training-free token reduction for diffusion models (token merging, token downsampling, auto): "
        "benchmark it, measure its quality, see what it does to a model.",
    )
    parser.add_argument("--version", action="version", version=f"tokenmerge {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    bench = commands.add_parser(
        "bench",
        help="time vanilla / tomesd / tokenmerge forwards on a built-in architecture (random weights)",
        description="Builds a diffusion model's architecture from its published config with random weights (no download) and "
        "times one forward per variant, interleaved with the order rotated every round, reporting medians with their "
        "range, speed-up, the share of time in image attention, and fidelity to vanilla.",
    )
    bench.add_argument("--model", choices=(*UNETS, *TRANSFORMERS), help="the architecture (default sd15)")
    bench.add_argument(
        "--blocks",
        type=int,
        help="transformers: keep only the first N blocks at full width (as the family counts them: flux N double + 2N single, "
        "flux2 N double + N single), where the whole model "
        "does not fit in memory or time; the per-block speed-up carries over",
    )
    bench.add_argument(
        "--sizes",
        type=_positive_size,
        nargs="+",
        help="image sizes in px (latent = px/8), or height x width for video models; default 768 (a --schedule's model: its "
        "pipeline's default size), where on a 2-core CPU the speed-ups stand clear of the timing noise "
        "(at 512 px image attention is a sixth of the time and they do not)",
    )
    bench.add_argument(
        "--frames",
        type=int,
        nargs="+",
        default=[],
        help="video models: video frames (e.g. 33 81; default: the pipeline's), each at every size (sizes may then be "
        "height x width, e.g. 480x832)",
    )
    bench.add_argument(
        "--batch", type=int, help="batch size (default 2 = one image with classifier-free guidance; a --schedule's model: 1, no CFG)"
    )
    bench.add_argument(
        "--repeats", type=int, default=2, help="timed forwards per variant and size after one warm-up (0: time the warm-up itself)"
    )
    bench.add_argument(
        "--variants",
        nargs="+",
        metavar="SPEC",
        help="configurations beside vanilla, e.g. tomesd:0.5 tome:0.5 todo:2 auto 'tome:0.5,share_plan=true' "
        "'tome:0.5,reuse_steps=3' 'tome:0.5,match_dtype=bfloat16' todo:2x2x2 (video: frames x height x width) (default: tomesd:0.5 (UNets) tome:0.5 auto)",
    )
    bench.add_argument(
        "--steps",
        type=int,
        default=0,
        help="time whole sampling loops of N steps instead of one forward (UNets: DDIM with CFG; transformers: "
        "flow-matching Euler); variants may then add accelerators: a UNet's auto+deepcache, tome:0.5+freeu, "
        "slicing; a transformer's step caches auto+fbcache, tome:0.5+taylorseer, magcache, fastercache, pab, "
        "dbcache (cache-dit; dbcache-nocal: without its calibrator) (default 0: one forward)",
    )
    bench.add_argument(
        "--schedule",
        choices=tuple(SCHEDULES),
        help="whole loops of a published few-step model: its transformer's config, steps, default size and its pipeline's "
        "sigmas, the variants patching its diffusers pipeline around it (where auto's few-step rule reads the schedule)",
    )
    bench.add_argument("--ratio", type=float, default=DEFAULTS.ratio, help="ratio of the default tomesd/tome rows and of --comfyui")
    bench.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    bench.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    bench.add_argument(
        "--compile",
        nargs="?",
        const="model",
        choices=("model", "blocks"),
        help="torch.compile (inductor) the whole model (bare --compile) or its repeated blocks (diffusers' compile_repeated_blocks, "
        "also in --steps loops); every variant runs through the one compiled model (tomesd does not trace)",
    )
    bench.add_argument("--plot", metavar="PNG", help="also plot speed-up against size per variant (needs matplotlib)")
    bench.add_argument(
        "--cp",
        type=int,
        default=0,
        metavar="RANKS",
        help="run under diffusers' Ulysses context parallelism over RANKS gloo processes on this machine (one thread each): "
        "per-rank forward time and the bytes each rank's attention sends, vanilla vs each variant (one transformer, one size; "
        "--steps N: a generation of N Euler calls, as the token cache needs)",
    )
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    bench.add_argument("--small", action="store_true", help="narrow variant of the architecture (smoke tests)")
    bench.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    bench.add_argument(
        "--comfyui",
        action="store_true",
        help="run ComfyUI's own model: SD 1.5's UNet (needs the comfy package; ComfyUI's TomePatchModel vs tokenmerge's node), "
        "or with --model flux / flux2 / qwen-image / wan / wan-ti2v / z-image its diffusion transformer at full width (--blocks N; a ComfyUI checkout "
        ">= 0.3.60 named by COMFYUI_PATH; vanilla vs the node's --variants, default todo:2 auto)",
    )
    bench.add_argument(
        "--beside-diffusers",
        action="store_true",
        help="with --comfyui on a transformer: the diffusers path's model and --variants in the same interleaved rounds, "
        "each against its own vanilla (both front ends' speed-ups from one process)",
    )
    bench.add_argument(
        "--comfy-attention",
        choices=("default", "pytorch", "sub-quadratic"),
        default="default",
        help="with --comfyui: ComfyUI's attention backend (default: ComfyUI's choice, sub-quadratic on CPU; pytorch: SDPA)",
    )
    bench.set_defaults(func=_bench)

    if REFERENCE:
        _reference_commands(commands)
    else:
        for name in ("eval", "train-reference", "distill-reference"):
            stub = commands.add_parser(name, help=f"(from a clone of the repository: {NO_REFERENCE})", add_help=False)
            stub.add_argument("rest", nargs=argparse.REMAINDER)
            stub.set_defaults(func=_no_reference)
    desc = commands.add_parser(
        "describe",
        help="what a patch does to a model family's published architecture or a diffusers folder, block by block, at a size",
        description="Builds the model from its config on the meta device (no weights, no memory, no download), patches it "
        "with --config and prints each block's action at --size; with a diffusers folder and --steps, how many of its "
        "scheduler's steps the noise gate (max_noise) reduces.",
    )
    desc.add_argument("model", help=f"a model family's example ({', '.join(TRANSFORMERS + UNETS)}) or a diffusers pipeline folder")
    desc.add_argument(
        "--config", default="auto", metavar="SPEC", help="the patch: tome:0.5, todo:2, auto, 'auto,max_noise=1', ... (default auto)"
    )
    desc.add_argument("--size", type=_positive_size, default=1024, help="image size in px, or height x width (default 1024)")
    desc.add_argument("--frames", type=int, help="video models: video frames (e.g. 81)")
    desc.add_argument("--steps", type=int, default=0, help="a diffusers folder: count the reduced steps of a generation of N steps")
    desc.set_defaults(func=_describe)
    support = commands.add_parser(
        "support",
        help="print the support matrix (model family x method x front end, with the classes) from the family registry",
    )
    support.add_argument("--notes", action="store_true", help="add how each family's token grid, text and positions are read")
    support.add_argument(
        "--write-readme",
        metavar="README",
        help="write the README's summary and docs/support.md's matrix between their markers instead of printing",
    )
    support.set_defaults(func=_support)
    options = commands.add_parser("options", help="print every option: its method, default, accepted values and what it does")
    options.add_argument("--write-docs", metavar="PAGE", help="replace the table between the page's markers instead of printing")
    options.set_defaults(func=lambda args: _generated_table("options_table", args))
    memory = commands.add_parser(
        "memory",
        help="print what the token cache holds for each family's published model at its default size (default and "
        "memory='low'), measured on its first blocks at full width",
    )
    memory.add_argument("--write-docs", metavar="PAGE", help="replace the table between the page's markers instead of printing")
    memory.set_defaults(func=lambda args: _generated_table("memory", args))
    frontier = commands.add_parser(
        "frontier",
        help="plot PSNR against the work saved from the JSON files of `tokenmerge eval --json` (needs matplotlib)",
        description="One panel per model and seed set of the files, a line per kind of configuration: the quality and "
        "work frontier, machine-independent (an eval's seconds on a 64 px model are not).",
    )
    frontier.add_argument("files", nargs="+", metavar="JSON", help="files written by `tokenmerge eval --json`")
    frontier.add_argument("--out", required=True, metavar="PNG")
    frontier.add_argument("--label", nargs="*", default=[], metavar="CONFIG", help="configurations named on the plot (e.g. tome:0.5)")
    frontier.set_defaults(func=_frontier)
    gpu = commands.add_parser(
        "gpu-run",
        help="the prepared GPU run: Flux.1 and Wan 2.1 1.3B at published widths, 28 steps, vanilla / ToMe / the token cache, "
        "eager and compiled: seconds, peak memory, syncs per step, as JSON",
        description="Random weights, bfloat16, SDPA, one GPU (at most about 8 minutes on an H100); --tiny: the same on the "
        "CPU at tiny sizes.",
    )
    gpu.add_argument("--out", required=True, metavar="JSON")
    gpu.add_argument("--models", nargs="+", default=["flux", "wan"], choices=["flux", "wan"])
    gpu.add_argument("--variants", nargs="+", default=None, metavar="VARIANT", help="of: vanilla, tome:0.5, tokencache, ... (default all)")
    gpu.add_argument("--steps", type=int, default=28)
    gpu.add_argument("--eager-only", action="store_true", help="skip the compiled runs")
    gpu.add_argument("--tiny", action="store_true", help="tiny configs and sizes on the CPU (a check of the command)")
    gpu.set_defaults(func=_gpu_run)
    return parser


def _gpu_run(args: argparse.Namespace) -> int:
    from .gpu_run import VARIANTS, run, write

    variants = tuple(args.variants or VARIANTS)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants must be of {', '.join(VARIANTS)}; got {', '.join(unknown)}")
    compiled = (False,) if args.eager_only else (False, True)
    found = write(run(tuple(args.models), variants, args.steps, args.tiny, compiled), args.out)
    for row in found["rows"]:
        memory = "" if row["peak_bytes"] is None else f", peak +{row['peak_bytes'] / 2**30:.2f} GiB, {row['syncs_per_step']:.1f} syncs/step"
        print(f"{row['model']:5} {row['variant']:22} {'compiled' if row['compiled'] else 'eager':8} {row['seconds']:8.2f} s{memory}")
    print(f"wrote {args.out} ({found['device']})")
    return 0


def _reference_commands(commands: Any) -> None:
    """``eval`` and ``train-reference``, where the reference models are installed (a clone)."""
    from .reference.models import DEFAULT_KIND, KINDS, SHIPPED

    ev = commands.add_parser(
        "eval",
        help="paired image quality (PSNR, SSIM, rel. L2) and speed of configurations vs vanilla sampling",
        description="Samples the shipped reference model (or --model) vanilla and with each configuration from the "
        "same seeds and noise, and reports PSNR / SSIM / relative L2 against vanilla with wall time and speed-up.",
    )
    ev.add_argument(
        "--model",
        help=f"a shipped reference model ({', '.join(SHIPPED)}), a reference .safetensors file or a diffusers pipeline folder "
        f"(default: {DEFAULT_KIND})",
    )
    ev.add_argument(
        "--configs",
        nargs="+",
        metavar="SPEC",
        help="e.g. tome:0.5 tomesd:0.5 todo:2 auto 'tome:0.5,share_plan=true' (default: tome:0.25 tome:0.5 tome:0.75 tomesd:0.5 todo:2 "
        "auto; on the video model its spatial / temporal / joint comparison, evaluate.VIDEO_CONFIGS)",
    )
    ev.add_argument("--seeds", type=int, default=2, help="number of seeds (one image each); the README's tables use 8")
    ev.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0): check a choice made on seeds 0..N-1 on others")
    ev.add_argument(
        "--steps", type=int, default=None, help="sampling steps (default: the model's own: 20 DDIM steps, a distilled model's 4)"
    )
    ev.add_argument(
        "--size",
        type=int,
        default=None,
        help="image size in px (default: the reference model's, 64 px, the video model's 32 px; a pipeline's 512 px)",
    )
    ev.add_argument("--frames", type=int, default=None, help="video reference model: frames per clip (default: the 4 it is trained on)")
    ev.add_argument(
        "--baseline",
        metavar="SPEC",
        help="also print each configuration's paired per-seed PSNR difference against this one (one of --configs, e.g. tome:0.5)",
    )
    ev.add_argument(
        "--guidance", type=float, default=None, help="classifier-free guidance scale (default 3; none for a guidance-distilled model)"
    )
    ev.add_argument("--threads", type=int, default=0)
    ev.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ev.add_argument("--grid", metavar="PNG", help="write a side-by-side image grid (vanilla and each configuration)")
    ev.add_argument(
        "--frontier", metavar="PNG", help="plot PSNR and SSIM against speed-up, a line per kind of configuration (needs matplotlib)"
    )
    ev.add_argument("--label", nargs="*", default=[], metavar="CONFIG", help="configurations named on the --frontier plot")
    ev.add_argument("--no-structure", dest="structure", action="store_false", help="skip the attention-structure table (entropy, distance)")
    ev.set_defaults(func=_eval)

    from .reference.train import TrainConfig

    d = TrainConfig()
    tr = commands.add_parser(
        "train-reference",
        help="train (or resume) a reference model on the photographs bundled in PyPI packages",
        description="Trains a small reference model (checkpointed every few minutes; an existing checkpoint in --out is resumed).",
    )
    tr.add_argument("--kind", choices=KINDS[:4], default=d.kind)
    tr.add_argument("--out", help="run folder (default: runs/KIND)")
    tr.add_argument("--hours", type=float, default=d.hours, help="wall-time budget of this invocation")
    tr.add_argument("--steps", type=int, default=0, help="stop at this step (default: only the time budget)")
    tr.add_argument("--batch", type=int, default=d.batch)
    tr.add_argument("--lr", type=float, default=d.lr)
    tr.add_argument("--seed", type=int, default=d.seed)
    tr.add_argument(
        "--structure-every", type=int, default=d.structure_every, help="steps between held-out attention-structure measurements"
    )
    tr.add_argument(
        "--crop-scale",
        type=float,
        nargs=2,
        default=d.crop_scale,
        metavar=("MIN", "MAX"),
        help="crop side as a fraction of the photograph's shorter side (default 0.25 1; 0.8 1 for a content phase)",
    )
    tr.add_argument(
        "--res",
        type=int,
        default=d.res,
        help="training resolution in px of this invocation (default: the evaluation size, 64 px, the video model's 32 px; 32 for a cheap first phase)",
    )
    tr.add_argument(
        "--frames",
        type=int,
        default=d.frames,
        help="video: frames per training clip in this invocation (default: the 4 it is evaluated at)",
    )
    tr.add_argument("--ema", type=float, default=d.ema, help="EMA decay of the saved weights (0.99 for a short resumed phase)")
    tr.add_argument(
        "--init-from",
        metavar="SAFETENSORS",
        default=d.init_from,
        help="without a checkpoint in --out, continue from these saved reference weights and their training log (fresh optimiser)",
    )
    tr.add_argument("--max-images", type=int, default=d.max_images, help="only the first N photographs (smoke tests)")
    tr.add_argument("--threads", type=int, default=0)
    tr.add_argument("--no-finish", dest="finish", action="store_false", help="skip the final measurements, sample grid and model card")
    tr.add_argument("--finish-only", action="store_true", help="only measure the run's weights and write its model card")
    tr.set_defaults(func=_train)

    from .reference.distill import DistillConfig

    dd = DistillConfig()
    di = commands.add_parser(
        "distill-reference",
        help="distil the Flux-style reference model to a 4-step one without CFG (the few-step yardstick)",
        description="Makes the teacher's trajectories, then trains the student on them (both resumed from --out), and "
        "writes the model card (tokenmerge.tools.reference.distill says how and why).",
    )
    di.add_argument("--out", default=dd.out, help=f"run folder (default: {dd.out})")
    di.add_argument("--teacher", default=dd.teacher, help="teacher weights (default: the shipped reference-flux)")
    di.add_argument("--trajectories", type=int, default=dd.trajectories, help="teacher trajectories to distil from")
    di.add_argument("--hours", type=float, default=dd.hours, help="wall-time budget of this invocation")
    di.add_argument("--steps", type=int, default=0, help="stop training at this step (default: only the time budget)")
    di.add_argument("--batch", type=int, default=dd.batch)
    di.add_argument("--lr", type=float, default=dd.lr)
    di.add_argument("--seed", type=int, default=dd.seed)
    di.add_argument("--threads", type=int, default=0)
    di.add_argument("--no-finish", dest="finish", action="store_false", help="skip the final measurements and model card")
    di.add_argument("--finish-only", action="store_true", help="only measure the run's weights and write its model card")
    di.set_defaults(func=_distill)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `tokenmerge`: what it can do, not an argparse complaint
        parser.print_help()
        return 0
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
