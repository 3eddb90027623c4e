"""``tokenmerge bench``: vanilla vs tomesd vs tokenmerge configurations on real diffusion architectures.

The model (SD 1.5, SD 2.1 or SDXL UNet; SD3-medium, SD3.5-medium, Flux.1-dev or PixArt-Σ transformer) is
built from its published config with random weights (no download). Variants run interleaved in one
process, the order rotated every round (so that load changes on a shared machine hit all of them alike);
the table gives medians with their min–max range, ratios and peak memory, and for every size the share of
vanilla's time spent in image attention (self- or joint attention over the image tokens) with the speed-up
it would allow if it cost nothing (the ceiling of any attention-only method). Fidelity compares each
variant's output with vanilla's on the same input: with random weights attention is nearly uniform, so
these numbers say little about image quality (see ``tokenmerge eval``).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.overrides import TorchFunctionMode

from .. import describe, patched
from .architectures import (
    BENCH_NOISE,
    TRANSFORMERS,
    UNETS,
    VAE_FACTOR,
    at_noise,
    build_model,
    denoised,
    timestep_scale,
    transformer_inputs,
    unet_inputs,
)
from .distilled import Schedule, image_tokens, schedule_named
from .examples import examples
from .progress import progress_bar, wait_while_paused
from .specs import PatchSpec, available
from .work import WorkCounter

_SDPA = torch.nn.functional.scaled_dot_product_attention


def default_specs(ratio: float = 0.5, model: str = "sd15") -> list[PatchSpec]:
    """The rows beside vanilla when none are asked for: tomesd (UNets only: it crashes on transformers) and
    tokenmerge at ``ratio``, and auto."""
    specs = [PatchSpec.parse(f"tome:{ratio}"), PatchSpec.parse("auto")]
    return ([PatchSpec.parse(f"tomesd:{ratio}")] if model in UNETS else []) + specs


class VideoSize(NamedTuple):
    """A video bench size: height and width in px, frames of video (the key of a video model's rows)."""

    height: int
    width: int
    frames: int

    def __str__(self) -> str:
        return f"{self.height}x{self.width} px, {self.frames} frames"


Size = int | VideoSize  # an image's side in px, or a video's size


def _pixels(size: Size) -> float:
    """Pixels (times frames) of a size: what the time of a forward grows with, about as its 1.5th power."""
    return float(size * size) if isinstance(size, int) else float(size.height * size.width * size.frames)


@dataclass
class Row:
    size_px: int  # the side of a square image, or a video's height
    variant: str
    median_s: float
    speedup: float
    cosine: float
    rel_l2: float
    # Peak above the memory in use before the forward (median over the timed rounds): max allocated on GPU;
    # on CPU the process RSS, which also depends on what the allocator kept from earlier forwards.
    peak_mem_mb: float
    min_s: float = 0.0
    max_s: float = 0.0
    attention_share: float | None = None  # vanilla rows: share of the time in image attention
    width_px: int | None = None  # video rows: the width, and the frames of video
    frames: int | None = None
    macs: int = 0  # multiply-adds of one forward or loop (counted in the warm-up round)
    less_work: float = 1.0  # vanilla's multiply-adds / this variant's

    @property
    def size(self) -> Size:
        return self.size_px if self.frames is None else VideoSize(self.size_px, self.width_px or self.size_px, self.frames)

    @property
    def ceiling(self) -> float | None:
        return None if self.attention_share is None else 1 / max(1e-9, 1 - self.attention_share)


@dataclass
class Variant:
    name: str
    forward: Callable[[dict[str, Any]], torch.Tensor]  # one model forward with this variant active
    baseline: str | None = None  # the variant its speed, work and output are measured against (default: the first)


class AttentionTimer(TorchFunctionMode):
    """Adds up the wall time of scaled_dot_product_attention calls over image tokens (queries and keys of
    one length: self-attention, or joint image+text attention); cross-attention to text is not counted.
    Attention computed by other kernels (ComfyUI's sub-quadratic attention) is not seen: ``calls`` stays 0."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.seconds = 0.0
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not _SDPA:
            return func(*args, **kwargs)
        q = args[0] if args else kwargs["query"]
        k = args[1] if len(args) > 1 else kwargs["key"]
        if q.shape[-2] != k.shape[-2]:
            return func(*args, **kwargs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return out


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@contextmanager
def peak_memory(device: torch.device) -> Iterator[list[float]]:
    """Yields a one-element list that holds, on exit, the peak memory (MiB) added during the block."""
    result = [0.0]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield result
        torch.cuda.synchronize(device)
        result[0] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
        return
    try:
        base = _rss_bytes()
    except OSError:  # no /proc (not Linux): memory is not reported
        yield result
        return
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], _rss_bytes())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield result
    finally:
        done.set()
        sampler.join()
        result[0] = (max(peak[0], _rss_bytes()) - base) / 2**20


def _forward(model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
    with torch.inference_mode():
        if "sample" not in inputs:  # a transformer
            return denoised(model(**inputs))
        # A UNet: positional sample/timestep/context, as tomesd reads the latent size from the first positional argument.
        extra = {k: v for k, v in inputs.items() if k not in ("sample", "timestep", "encoder_hidden_states")}
        return model(inputs["sample"], inputs["timestep"], inputs["encoder_hidden_states"], **extra).sample


def _patched(
    model: torch.nn.Module, spec: PatchSpec, defaults: dict[str, Any], called: torch.nn.Module | None = None
) -> Callable[[dict[str, Any]], torch.Tensor]:
    """A forward of ``called`` (default: ``model``; its compiled wrapper) with ``model`` patched by ``spec``."""

    def forward(inputs: dict[str, Any]) -> torch.Tensor:
        with spec.applied(model, **defaults):
            return _forward(model if called is None else called, inputs)

    return forward


def _sampled(pipe: Any, spec: PatchSpec | None, defaults: dict[str, Any], steps: int) -> Callable[[dict[str, Any]], torch.Tensor]:
    """One whole sampling loop of ``steps`` steps with the spec (and its accelerators) on the pipeline."""
    from .pipelines import sample_latents

    def sample(inputs: dict[str, Any]) -> torch.Tensor:
        with contextlib.nullcontext() if spec is None else spec.applied(pipe, **defaults):
            return sample_latents(pipe, inputs["size_px"], steps, seed=inputs["seed"], batch=inputs["batch"])

    return sample


def _looped(
    net: torch.nn.Module, name: str, spec: PatchSpec | None, defaults: dict[str, Any], clock: Any, plan: Schedule | None = None
) -> Callable[[dict[str, Any]], torch.Tensor]:
    """One whole flow-matching loop of a transformer (:func:`tokenmerge.tools.loops.flow_loop`) with the spec and its
    step caches on; with a published few-step ``plan``, at its scheduler's sigmas, the spec patching its pipeline around
    the transformer and that scheduler (where the few-step rule reads the schedule)."""
    from .loops import flow_loop

    if plan is None:

        def sample(inputs: dict[str, Any]) -> torch.Tensor:
            with contextlib.nullcontext() if spec is None else spec.applied(net, clock=clock, **defaults):
                return flow_loop(net, name, inputs, clock)

        return sample
    pipe = plan.pipeline_around(net)

    def scheduled(inputs: dict[str, Any]) -> torch.Tensor:
        plan.set_timesteps(pipe, image_tokens(inputs))
        with contextlib.nullcontext() if spec is None else spec.applied(pipe, clock=clock, **defaults):
            return flow_loop(net, name, inputs, clock, pipe.scheduler.sigmas.tolist())

    return scheduled


COMPILE_MODES = ("model", "blocks")


def _compile(net: torch.nn.Module, mode: str, log: Callable[[str], None]) -> torch.nn.Module:
    """``net`` compiled as a whole (``model``: the module to call) or block by block (``blocks``: diffusers'
    ``compile_repeated_blocks``, ``net`` itself then runs its compiled blocks). Every variant runs through it, patched
    for its own calls: dynamo guards on the hooks (``skip_nnmodule_hook_guards`` off, else a graph traced without
    them would run for every variant) and keeps one graph per variant, with room for them all (``recompile_limit``)."""
    torch._dynamo.config.skip_nnmodule_hook_guards = False
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 1024)
    if mode == "model":
        return torch.compile(net)
    if not getattr(net, "_repeated_blocks", None):
        raise ValueError(f"--compile blocks: diffusers declares no repeated blocks for {type(net).__name__}; use --compile model")
    net.compile_repeated_blocks()  # not fullgraph: a step cache's decision inside a block is a graph break
    log(f"--compile blocks: {', '.join(net._repeated_blocks)} compiled (torch.compile, inductor), the rest eager")
    return net


def _fidelity(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    a, b = out.double().flatten(), ref.double().flatten()
    cosine = torch.nn.functional.cosine_similarity(a, b, dim=0).item()
    return cosine, ((a - b).norm() / b.norm()).item()


def time_variants(
    variants: list[Variant],
    inputs_by_size: dict[Size, Callable[[], dict[str, Any]]],
    repeats: int,
    device: torch.device = torch.device("cpu"),
    log: Callable[[str], None] = print,
    time_attention: bool = True,
) -> list[Row]:
    """Interleave the variants for each size, rotating their order every round; one warm-up round records the
    outputs and vanilla's attention share (with ``repeats=0`` that round is also the timed one, and vanilla's
    time then includes the attention timer's small overhead). ``time_attention=False`` (compiled variants: a
    graph traced under the timer's mode would be another graph than the timed rounds run) leaves the share out.

    Before each size after the first, the time is estimated from the previous size's warm-up round
    (scaled by the 1.5th power of the pixel ratio: between linear-in-tokens layers and quadratic attention).
    """
    bar = progress_bar(len(inputs_by_size) * len(variants) * (repeats + 1), "bench")
    say = log if bar is None else lambda message: bar.write(message, file=sys.stderr)  # on a line of its own, not on the bar
    rows: list[Row] = []
    previous: tuple[Size, float] | None = None
    for size, make_inputs in inputs_by_size.items():
        if previous is not None:
            estimate = previous[1] * (_pixels(size) / _pixels(previous[0])) ** 1.5 * (repeats + 1)
            say(f"{_label(size)}: about {estimate / 60:.1f} min (estimated from {_label(previous[0])})")
        inputs = make_inputs()
        outputs: dict[str, torch.Tensor] = {}
        times: dict[str, list[float]] = {v.name: [] for v in variants}
        memory: dict[str, list[float]] = {v.name: [] for v in variants}
        macs: dict[str, int] = {}
        attention_share = None
        for rep in range(repeats + 1):
            round_started = time.perf_counter()
            shift = rep % len(variants)  # rotate the order each round: no variant always runs first
            for variant in variants[shift:] + variants[:shift]:
                wait_while_paused()
                timer = AttentionTimer(device) if time_attention and rep == 0 and variant is variants[0] else None
                with peak_memory(device) as peak:
                    t0 = time.perf_counter()
                    counter = WorkCounter() if rep == 0 and time_attention else contextlib.nullcontext()  # (compiled: not traced under it)
                    with counter, timer if timer is not None else contextlib.nullcontext():
                        out = variant.forward(inputs)
                    if rep == 0:
                        macs[variant.name] = counter.total if isinstance(counter, WorkCounter) else 0
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    elapsed = time.perf_counter() - t0
                if timer is not None and timer.calls:
                    attention_share = timer.seconds / elapsed
                if rep == 0:
                    outputs[variant.name] = out.float().cpu()
                if rep > 0 or repeats == 0:  # repeats=0: one round, timed (for sizes where a forward takes minutes)
                    times[variant.name].append(elapsed)
                    memory[variant.name].append(peak[0])
                if bar is not None:
                    bar.update(1)
            if rep == 0:
                warmup = time.perf_counter() - round_started
                previous = (size, warmup)
                if repeats:
                    say(f"{_label(size)}: warm-up round {warmup:.1f} s; about {warmup * repeats / 60:.1f} min to go for this size")
        for variant in variants:
            ref = variant.baseline or variants[0].name
            t = times[variant.name]
            median = statistics.median(t)
            cosine, rel_l2 = _fidelity(outputs[variant.name], outputs[ref])
            share = attention_share if variant is variants[0] else None
            video = size if isinstance(size, VideoSize) else None
            rows.append(
                Row(
                    size if video is None else video.height,
                    variant.name,
                    median,
                    statistics.median(times[ref]) / median,
                    cosine,
                    rel_l2,
                    statistics.median(memory[variant.name]),
                    min(t),
                    max(t),
                    share,
                    None if video is None else video.width,
                    None if video is None else video.frames,
                    macs[variant.name],
                    macs[ref] / macs[variant.name] if macs[variant.name] else float("nan"),
                )
            )
    if bar is not None:
        bar.close()
    return rows


def _label(size: Size) -> str:
    return f"{size} px" if isinstance(size, int) else str(size)


def run_bench(
    model: str = "sd15",
    sizes_px: tuple[int | tuple[int, int], ...] = (512,),
    batch: int = 2,
    repeats: int = 2,
    specs: list[PatchSpec] | None = None,
    seed: int = 0,
    small: bool = False,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    compile: str | None = None,
    blocks: int | None = None,
    steps: int = 0,
    frames: tuple[int, ...] = (),
    schedule: str | None = None,
    log: Callable[[str], None] = print,
) -> list[Row]:
    """The diffusers model of ``model``: vanilla and each spec (default: :func:`default_specs`), one forward per
    variant, or (``steps`` > 0, UNets) one whole sampling loop of that many steps per variant, where specs may
    combine tokenmerge with accelerators that work across steps (``auto+deepcache``). Sizes are px, square or
    ``(height, width)``; a video model runs each size at each of ``frames`` (video frames; default: its
    pipeline's). ``schedule``: a published few-step model's (:mod:`tokenmerge.tools.distilled`): its transformer's
    config, its steps and its pipeline's sigmas."""
    wanted = default_specs(model=model) if specs is None else specs
    plan = None
    if schedule is not None:
        plan = schedule_named(schedule)
        if model != plan.model:
            raise ValueError(f"--schedule {schedule} runs on the {plan.model} architecture, not {model}")
        if steps not in (0, plan.steps):
            raise ValueError(f"--schedule {schedule} samples in {plan.steps} steps, not {steps}")
        if any(s.accelerators for s in wanted):
            raise ValueError(f"--schedule {schedule}: a few-step loop times token reduction alone (a step cache has no steps to skip)")
        steps = plan.steps
    if model in TRANSFORMERS and any(s.method == "tomesd" for s in wanted):
        raise ValueError(f"tomesd does not support {model} (it patches UNet BasicTransformerBlocks only); drop the tomesd rows")
    if any(s.accelerators for s in wanted) and not steps:
        raise ValueError("accelerators (+deepcache, +fbcache, ...) work on whole sampling loops: add --steps N")
    if compile is not None and compile not in COMPILE_MODES:
        raise ValueError(f"compile must be one of {', '.join(COMPILE_MODES)}, got {compile!r}")
    if steps and compile == "model":
        raise ValueError("--steps: a whole sampling loop compiles block by block (--compile blocks), not as one model")
    if compile and any(s.method == "tomesd" for s in wanted):
        log("--compile: tomesd is left out (its patched UNet does not trace: see tests/test_compile.py)")
        wanted = [s for s in wanted if s.method != "tomesd"]
    if steps and model in UNETS and any(s.caches for s in wanted):
        raise ValueError(f"{model}: the step caches (+fbcache, +dbcache, ...) act on transformers; a UNet's is +deepcache")
    if steps and model in TRANSFORMERS and any(len(s.caches) < len(s.accelerators) for s in wanted):
        raise ValueError(f"{model}: +deepcache, +freeu and +slicing act on a UNet pipeline; a transformer's are its step caches")
    specs = available(wanted)
    if len(specs) < len(wanted):
        log("tomesd is not installed: its rows are left out (pip install tomesd==0.1.3)")
    started = time.perf_counter()
    overrides = plan.overrides if plan is not None and not small else None
    net = build_model(model, small=small, seed=seed, dtype=dtype, blocks=blocks, overrides=overrides).to(device)
    log(f"built {describe_model(model, small, blocks)} with random weights in {time.perf_counter() - started:.1f} s")
    defaults: dict[str, Any] = {"seed": seed}
    if model in UNETS:
        with patched(net):
            # tomesd gets tokenmerge's level: its own default (1) merges nothing on SDXL.
            defaults["max_downsample"] = describe(net).denoisers[0].top_level
    called = net if compile is None else _compile(net, compile, log)
    suffix = "" if compile is None else f" (compiled {compile})"
    if steps and model in TRANSFORMERS:
        from .caches import Clock

        clock = Clock(steps)
        variants = [Variant("vanilla" + suffix, _looped(net, model, None, defaults, clock, plan))]
        variants += [Variant(s.name + suffix, _looped(net, model, s, defaults, clock, plan)) for s in specs]
    elif steps:
        from .pipelines import latent_pipeline

        pipe = latent_pipeline(net)
        variants = [Variant("vanilla" + suffix, _sampled(pipe, None, defaults, steps))]
        variants += [Variant(s.name + suffix, _sampled(pipe, s, defaults, steps)) for s in specs]
        pipe_inputs = lambda size: {"size_px": size, "seed": seed, "batch": batch // 2 or 1}  # noqa: E731 (CFG doubles it)
        sized = {size: (lambda size=size: pipe_inputs(size)) for size in sizes_px}
        return time_variants(variants, sized, repeats, net.device, log, time_attention=compile is None)
    else:
        variants = [Variant("vanilla" + suffix, lambda inputs: _forward(called, inputs))]
        variants += [Variant(s.name + suffix, _patched(net, s, defaults, called)) for s in specs]

    example = None if model in UNETS else examples()[model][1]
    keys = bench_sizes(example, sizes_px, frames)
    scale = timestep_scale(net)

    def make_inputs(size: Size) -> dict[str, Any]:
        if model in UNETS:
            latent = size // VAE_FACTOR
            inputs = unet_inputs(net, latent, latent, batch=batch, seed=seed)
        else:
            (height, width), latent_frames = latent_size(example, size)
            extra = {} if latent_frames is None else {"frames": latent_frames}
            inputs = transformer_inputs(net, model, height, width, batch=batch, seed=seed, text_tokens=8 if small else None, **extra)
        if not steps:  # one forward times a low-noise step, which every method's default reduces
            inputs = at_noise(inputs, scale, BENCH_NOISE)
        return {k: _to(v, net.device) for k, v in inputs.items()}

    sized = {size: (lambda size=size: make_inputs(size)) for size in keys}
    return time_variants(variants, sized, repeats, net.device, log, time_attention=compile is None)


def bench_sizes(example: Any, sizes_px: tuple[int | tuple[int, int], ...], frames: tuple[int, ...]) -> list[Size]:
    """The keys of a bench: square image sides, or, for a video model, (height, width, frames) for every size and
    frame count (default frames: the pipeline's, from the example's latent frames)."""
    video = example is not None and example.frames
    if not video:
        if frames:
            raise ValueError("--frames is for video models (wan, cogvideox, hunyuanvideo15, ltx2, ...)")
        bad = [s for s in sizes_px if not isinstance(s, int)]
        if bad:
            raise ValueError(f"image models take square sizes (e.g. 1024), got {'x'.join(map(str, bad[0]))}")
        return list(sizes_px)
    counts = frames or ((example.frames - 1) * example.frame_factor + 1,)
    return [VideoSize(*((s, s) if isinstance(s, int) else s), f) for s in sizes_px for f in counts]


def latent_size(example: Any, size: Size) -> tuple[tuple[int, int], int | None]:
    """The latent (height, width) of a bench size and, for a video, its latent frames (the VAE's causal first
    frame, then one latent frame per ``frame_factor`` video frames)."""
    if isinstance(size, int):
        return (size // VAE_FACTOR, size // VAE_FACTOR), None
    f = example.vae_factor
    return (size.height // f, size.width // f), (size.frames - 1) // example.frame_factor + 1


def describe_model(model: str, small: bool, blocks: int | None) -> str:
    """How a bench model is labelled: its name, and whether it is narrowed or has fewer blocks."""
    kind = "UNet" if model in UNETS else "transformer"
    label = f"{model}{' (small)' if small else ''} {kind}"
    if blocks is not None:
        example = examples()[model][1]
        config = example.blocks(example.config, blocks) if example.blocks else example.config
        counts = ", ".join(f"{k}={v}" for k, v in config.items() if "layers" in k and isinstance(v, int))
        label += f", its first blocks at full width ({counts})"
    return label


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value.to(device) if isinstance(value, torch.Tensor) else value


def run_comfy_bench(
    sizes_px: tuple[int, ...] = (512,),
    batch: int = 2,
    repeats: int = 2,
    ratio: float = 0.5,
    seed: int = 0,
    small: bool = False,
    attention: str = "default",
    log: Callable[[str], None] = print,
) -> list[Row]:
    """ComfyUI's own SD 1.5 UNet: vanilla, ComfyUI's built-in TomePatchModel, tokenmerge's node (tome and auto).

    ``attention``: ComfyUI's attention backend, chosen when its package is first imported (so once per
    process): ``default`` (on CPU, sub-quadratic attention) or ``pytorch`` (SDPA, ``--use-pytorch-cross-attention``)."""
    from .comfy_models import CONFIGS, attention_backend, build_comfy_patcher, comfy_run, import_comfy, sigma_at_noise

    import_comfy(attention)
    from comfy_extras.nodes_tomesd import TomePatchModel

    from ..integrations.comfyui import TokenMergeNode

    name = "sd15-small" if small else "sd15"
    started = time.perf_counter()
    log(f"ComfyUI attention backend: {attention_backend()}")
    patcher = build_comfy_patcher(name, seed)
    log(f"built ComfyUI's {name} UNet with random weights in {time.perf_counter() - started:.1f} s")
    builtin = TomePatchModel().patch(patcher, ratio)[0]
    ours = TokenMergeNode().patch(patcher, ratio=ratio, seed=seed)[0]
    auto = TokenMergeNode().patch(patcher, method="auto")[0]

    sigma = sigma_at_noise(patcher.model.model_sampling, BENCH_NOISE)  # a low-noise step: every default reduces it

    def forward(p: Any) -> Callable[[dict[str, Any]], torch.Tensor]:
        return lambda inputs: comfy_run(p, inputs["x"], sigma=sigma, context=inputs["context"])

    variants = [
        Variant("vanilla", forward(patcher)),
        Variant(f"ComfyUI TomePatchModel r={ratio}", forward(builtin)),
        Variant(f"tokenmerge node r={ratio}", forward(ours)),
        Variant("tokenmerge node auto", forward(auto)),
    ]

    def make_inputs(size: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(batch, 4, size // 8, size // 8, generator=g)
        return {"x": x, "context": torch.randn(batch, 77, CONFIGS[name]["context_dim"], generator=g)}

    return time_variants(variants, {size: (lambda size=size: make_inputs(size)) for size in sizes_px}, repeats, log=log)


def run_comfy_dit_bench(
    model: str,
    sizes_px: tuple[int | tuple[int, int], ...] = (1024,),
    repeats: int = 2,
    specs: tuple[str, ...] = ("todo:2", "auto"),
    blocks: int = 1,
    frames: tuple[int, ...] = (),
    attention: str = "pytorch",
    steps: int = 0,
    cfg: float = 2.0,
    beside_diffusers: bool = False,
    log: Callable[[str], None] = print,
) -> list[Row]:
    """ComfyUI's own diffusion transformer ``model`` (flux, flux2, qwen-image, wan, wan-ti2v, z-image) at its published width with its first
    ``blocks`` blocks: vanilla and tokenmerge's node per spec, each timed as one step of ComfyUI's KSampler (at
    ``cfg`` 2 one model call on the conditional and unconditional batch of two, at 1 the conditional alone), or with
    ``steps`` a whole KSampler loop of that many steps from pure noise (what a token cache needs; CFG 1 as the
    diffusers loops). Needs a ComfyUI checkout (>= 0.3.60) named by ``COMFYUI_PATH``; ``attention="pytorch"`` (SDPA) lets the
    attention share be measured. ``beside_diffusers``: the diffusers path's twin (vanilla and each spec, one forward
    of the same batch at the same size and noise level) interleaved in the same rounds, each measured against its
    own vanilla: both front ends' speed-ups from one process, not from two runs on a shared machine."""
    import os

    from .architectures import TEXT_TOKENS
    from .comfy_models import attention_backend, import_comfy_checkout

    checkout = os.environ.get("COMFYUI_PATH")
    if not checkout:
        raise ValueError("--comfyui on a transformer needs a ComfyUI checkout (>= 0.3.60): set COMFYUI_PATH to its folder")
    if beside_diffusers and steps:
        raise ValueError("--beside-diffusers times one step of each front end; drop --steps")
    # diffusers first: its model classes import transformers, which fails on what ComfyUI's import leaves patched
    net = build_model(model, blocks=blocks) if beside_diffusers else None
    import_comfy_checkout(checkout, attention)
    from ..config import TokenMergeConfig
    from ..integrations.comfyui import patch_model
    from . import comfy_dits

    log(f"ComfyUI attention backend: {attention_backend()}")
    patcher = comfy_dits.build(model, blocks=blocks)
    tokens = TEXT_TOKENS[model]
    # one step from a low noise level, which every default reduces; or a whole loop
    step: dict[str, Any] = dict(tokens=tokens, full=True, cfg=cfg) if steps else dict(tokens=tokens, full=True, cfg=cfg, noise=BENCH_NOISE)
    count = steps or 1
    variants = [Variant("vanilla", lambda inputs: comfy_dits.sample(patcher, model, count, **step, **_comfy(inputs)))]
    for spec in specs:
        parsed = PatchSpec.parse(spec)
        patched = patch_model(patcher, TokenMergeConfig(**parsed.kwargs()))
        name = f"tokenmerge node {parsed.name.removeprefix('tokenmerge ')}"
        variants.append(Variant(name, lambda inputs, p=patched: comfy_dits.sample(p, model, count, **step, **_comfy(inputs))))
    diffusers_inputs = None
    if net is not None:
        variants.append(Variant("diffusers vanilla", lambda inputs: _forward(net, inputs["diffusers"]), baseline="diffusers vanilla"))
        for spec in specs:
            parsed = PatchSpec.parse(spec)
            forward = _patched(net, parsed, {"seed": 0})
            variants.append(
                Variant(f"diffusers {parsed.name}", lambda inputs, f=forward: f(inputs["diffusers"]), baseline="diffusers vanilla")
            )

        def diffusers_inputs(size: Size) -> dict[str, Any]:
            (height, width), latent_frames = latent_size(examples()[model][1], size)
            extra = {} if latent_frames is None else {"frames": latent_frames}
            inputs = transformer_inputs(net, model, height, width, batch=int(cfg), **extra)
            return at_noise(inputs, timestep_scale(net), BENCH_NOISE)

    example = comfy_dits.example(model)
    video, down = example.video, example.downscale
    sizes: dict[Size, Callable[[], dict[str, Any]]] = {}
    for size in sizes_px:
        h, w = (size, size) if isinstance(size, int) else size
        for f in frames or ((81,) if video else (0,)):
            key = VideoSize(h, w, f) if video else size
            latent = {"height": h // down, "width": w // down} | ({"frames": (f - 1) // 4 + 1} if video else {})
            if diffusers_inputs is None:
                sizes[key] = lambda latent=latent: latent
            else:
                sizes[key] = lambda latent=latent, key=key: latent | {"diffusers": diffusers_inputs(key)}
    return time_variants(variants, sizes, repeats, log=log)


def _comfy(inputs: dict[str, Any]) -> dict[str, Any]:
    """The ComfyUI sampler's latent size of a bench's inputs (without the diffusers twin's)."""
    return {k: v for k, v in inputs.items() if k != "diffusers"}


def format_table(rows: list[Row], model: str, batch: int, device: str = "cpu", timed: str = "forward", rounds: int | None = None) -> str:
    """The rows as markdown tables, one per size, each followed by what is within the noise it measured, and a
    legend; ``timed``: what one timing covers (a forward, a sampling run); ``rounds``: timed rounds per variant."""
    where = f"{torch.get_num_threads()} threads" if device == "cpu" else device
    width = max([24, *(len(r.variant) for r in rows)])
    lines = []
    for size in dict.fromkeys(r.size for r in rows):
        if isinstance(size, int):
            lines.append(f"\n{model}, {size}x{size} px ({size // VAE_FACTOR}x{size // VAE_FACTOR} latent), batch {batch}, {where}")
        else:
            lines.append(f"\n{model}, {size}, batch {batch}, {where}")
        vanilla = next(r for r in rows if r.size == size)
        if vanilla.attention_share is not None:
            lines.append(
                f"image attention: {vanilla.attention_share:.0%} of vanilla's time; ceiling of attention-only speed-ups {vanilla.ceiling:.2f}x"
            )
        lines.append(
            f"| {'variant':<{width}} | {'median s/' + timed:>16} | {'min-max s':>15} | {'speed-up':>8} | {'peak MiB':>8} | {'cosine':>8} | {'rel. L2':>8} | {'GMACs':>9} | {'less work':>9} |"
        )
        lines.append(f"|{'-' * (width + 2)}|{'-' * 18}|{'-' * 17}|{'-' * 10}|{'-' * 10}|{'-' * 10}|{'-' * 10}|{'-' * 11}|{'-' * 11}|")
        for r in (r for r in rows if r.size == size):
            spread = f"{r.min_s:.2f}-{r.max_s:.2f}"
            lines.append(
                f"| {r.variant:<{width}} | {r.median_s:>16.3f} | {spread:>15} | {r.speedup:>7.2f}x | {r.peak_mem_mb:>8.0f} | {r.cosine:>8.5f} | "
                f"{r.rel_l2:>8.4f} | {r.macs / 1e9:>9.1f} | {r.less_work:>8.2f}x |"
            )
        lines += noise_notes([r for r in rows if r.size == size])
    lines.append(legend(rounds, timed))
    return "\n".join(lines)


def noise_notes(rows: list[Row]) -> list[str]:
    """Plain words for differences the bench cannot tell from noise: a variant whose min-max range overlaps
    vanilla's, and an attention-only method (alone: not stacked on a cache) faster than the attention ceiling allows."""
    vanilla, notes = rows[0], []
    overlapping = [r.variant for r in rows[1:] if r.min_s <= vanilla.max_s and r.max_s >= vanilla.min_s]
    if overlapping:
        notes.append(f"within the noise measured (min-max overlaps vanilla's): {', '.join(overlapping)}")
    ceiling = vanilla.ceiling
    above = [
        r.variant
        for r in rows[1:]
        if ceiling and ("auto" in r.variant or "todo" in r.variant) and " + " not in r.variant and r.speedup > 1.02 * ceiling
    ]
    if above:
        notes.append(f"above the attention-only ceiling {ceiling:.2f}x, so partly noise: {', '.join(above)}")
    return notes


def legend(rounds: int | None, timed: str) -> str:
    count = "each variant's timed rounds" if rounds is None else f"{max(rounds, 1)} timed round(s) per variant"
    return (
        f"\nspeed-up: vanilla's median / the variant's ({count}, interleaved, order rotated each round); min-max: the "
        f"fastest and slowest {timed}; peak MiB: the process's memory growth during one {timed}; cosine, rel. L2: the "
        "output against vanilla's from the same inputs (random weights: they show that a patch acts and how much, not "
        f"image quality: see docs/quality.md); GMACs: multiply-adds of one {timed} (linear layers, matrix products, "
        "convolutions, attention; counted in the warm-up round, machine-independent), less work: vanilla's / the variant's"
    )


def rows_to_json(rows: list[Row], **meta: Any) -> str:
    return json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2)


def plot_speedups(rows: list[Row], path: str | Path, title: str) -> None:
    """Speed-up over vanilla against image size, one line per variant: medians with min–max bars (the spread
    of each variant's timed rounds against vanilla's median), so the noise is visible (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise SystemExit("tokenmerge bench: error: --plot needs matplotlib (pip install matplotlib)") from error
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name in dict.fromkeys(r.variant for r in rows):
        points = sorted((r.size_px, r) for r in rows if r.variant == name)
        sizes = [p[0] for p in points]
        medians = [p[1].speedup for p in points]
        lows = [m - p[1].speedup * p[1].median_s / max(p[1].max_s, 1e-9) for m, p in zip(medians, points)]
        highs = [p[1].speedup * p[1].median_s / max(p[1].min_s, 1e-9) - m for m, p in zip(medians, points)]
        ax.errorbar(sizes, medians, yerr=[lows, highs], marker="o", capsize=3, label=name)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("image size (px, square)")
    ax.set_ylabel("speed-up over vanilla (median, min-max)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
