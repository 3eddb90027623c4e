"""``tokenmerge bench``: vanilla vs tomesd vs tokenmerge on a real SD UNet architecture, side by side.

The UNet is built from its published config with random weights (no download). Variants run
interleaved in one process (vanilla, tomesd, tokenmerge, vanilla, ...) so that load changes on a
shared machine hit all of them alike; the table gives medians and ratios. Fidelity compares each
variant's UNet output with vanilla's on the same input: with random weights attention is nearly
uniform, so these numbers say little about image quality (see ``tokenmerge eval`` for that).
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from . import apply_patch, remove_patch
from .architectures import build_unet, unet_inputs
from .progress import progress_bar


@dataclass
class Row:
    size_px: int
    variant: str
    median_s: float
    speedup: float
    cosine: float
    rel_l2: float


@dataclass
class Variant:
    name: str
    forward: Callable[[dict[str, Any]], torch.Tensor]  # one UNet forward with this variant active


def _patched(unet: torch.nn.Module, patch: Callable[[torch.nn.Module], Any], unpatch: Callable[[torch.nn.Module], Any]):
    def forward(inputs: dict[str, Any]) -> torch.Tensor:
        patch(unet)
        try:
            return _forward(unet, inputs)
        finally:
            unpatch(unet)

    return forward


def _diffusers_variants(unet: torch.nn.Module, ratio: float, level: int, seed: int) -> list[Variant]:
    variants = [Variant("vanilla", lambda inputs: _forward(unet, inputs))]
    if importlib.util.find_spec("tomesd") is not None:
        import tomesd

        tome = _patched(unet, lambda m: tomesd.apply_patch(m, ratio=ratio, max_downsample=level), tomesd.remove_patch)
        variants.append(Variant(f"tomesd 0.1.3 r={ratio}", tome))
    ours = _patched(unet, lambda m: apply_patch(m, ratio=ratio, seed=seed), remove_patch)
    return variants + [Variant(f"tokenmerge r={ratio}", ours)]


def _forward(unet: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
    # Positional sample/timestep/context: tomesd reads the latent size from the first positional argument.
    extra = {k: v for k, v in inputs.items() if k not in ("sample", "timestep", "encoder_hidden_states")}
    with torch.inference_mode():
        return unet(inputs["sample"], inputs["timestep"], inputs["encoder_hidden_states"], **extra).sample


def _fidelity(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    a, b = out.double().flatten(), ref.double().flatten()
    cosine = torch.nn.functional.cosine_similarity(a, b, dim=0).item()
    return cosine, ((a - b).norm() / b.norm()).item()


def time_variants(
    variants: list[Variant], inputs_by_size: dict[int, Callable[[], dict[str, Any]]], repeats: int
) -> list[Row]:
    """Interleave the variants (vanilla first) for each size; one warm-up round records the outputs."""
    bar = progress_bar(len(inputs_by_size) * len(variants) * (repeats + 1), "bench")
    rows: list[Row] = []
    for size, make_inputs in inputs_by_size.items():
        inputs = make_inputs()
        outputs: dict[str, torch.Tensor] = {}
        times: dict[str, list[float]] = {v.name: [] for v in variants}
        for rep in range(repeats + 1):
            for variant in variants:
                t0 = time.perf_counter()
                out = variant.forward(inputs)
                elapsed = time.perf_counter() - t0
                if rep == 0:
                    outputs[variant.name] = out
                else:
                    times[variant.name].append(elapsed)
                if bar is not None:
                    bar.update(1)
        base = statistics.median(times[variants[0].name])
        for variant in variants:
            median = statistics.median(times[variant.name])
            cosine, rel_l2 = _fidelity(outputs[variant.name], outputs[variants[0].name])
            rows.append(Row(size, variant.name, median, base / median, cosine, rel_l2))
    if bar is not None:
        bar.close()
    return rows


def run_bench(
    model: str = "sd15",
    sizes_px: tuple[int, ...] = (512,),
    batch: int = 2,
    repeats: int = 2,
    ratio: float = 0.5,
    seed: int = 0,
    small: bool = False,
    log: Callable[[str], None] = print,
) -> list[Row]:
    """diffusers UNet of ``model``: vanilla, tomesd (when installed) and tokenmerge."""
    started = time.perf_counter()
    unet = build_unet(model, small=small, seed=seed)
    log(f"built {model}{' (small)' if small else ''} UNet with random weights in {time.perf_counter() - started:.1f} s")
    apply_patch(unet, ratio=ratio)
    level = unet._tokenmerge_state.top_level  # the level tokenmerge's auto mode merges; tomesd gets the same
    remove_patch(unet)
    variants = _diffusers_variants(unet, ratio, level, seed)
    inputs = {size: (lambda size=size: unet_inputs(unet, size // 8, size // 8, batch=batch, seed=seed)) for size in sizes_px}
    return time_variants(variants, inputs, repeats)


def run_comfy_bench(
    sizes_px: tuple[int, ...] = (512,), batch: int = 2, repeats: int = 2, ratio: float = 0.5, seed: int = 0, small: bool = False, log: Callable[[str], None] = print
) -> list[Row]:
    """ComfyUI's own SD 1.5 UNet: vanilla, ComfyUI's built-in TomePatchModel and tokenmerge's node."""
    from comfy_extras.nodes_tomesd import TomePatchModel

    from .comfyui import TokenMergeNode
    from .comfyui_models import CONFIGS, build_comfy_patcher, comfy_run

    name = "sd15-small" if small else "sd15"
    started = time.perf_counter()
    patcher = build_comfy_patcher(name, seed)
    log(f"built ComfyUI's {name} UNet with random weights in {time.perf_counter() - started:.1f} s")
    builtin = TomePatchModel().patch(patcher, ratio)[0]
    ours = TokenMergeNode().patch(patcher, ratio=ratio, seed=seed)[0]

    def forward(p: Any) -> Callable[[dict[str, Any]], torch.Tensor]:
        return lambda inputs: comfy_run(p, inputs["x"], context=inputs["context"])

    variants = [
        Variant("vanilla", forward(patcher)),
        Variant(f"ComfyUI TomePatchModel r={ratio}", forward(builtin)),
        Variant(f"tokenmerge node r={ratio}", forward(ours)),
    ]

    def make_inputs(size: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(batch, 4, size // 8, size // 8, generator=g)
        return {"x": x, "context": torch.randn(batch, 77, CONFIGS[name]["context_dim"], generator=g)}

    return time_variants(variants, {size: (lambda size=size: make_inputs(size)) for size in sizes_px}, repeats)


def format_table(rows: list[Row], model: str, batch: int) -> str:
    lines = []
    for size in sorted({r.size_px for r in rows}):
        lines.append(f"\n{model} UNet, {size}x{size} px ({size // 8}x{size // 8} latent), batch {batch}, {torch.get_num_threads()} threads")
        lines.append(f"| {'variant':<22} | {'median s/forward':>16} | {'speed-up':>8} | {'cosine':>8} | {'rel. L2':>8} |")
        lines.append(f"|{'-' * 24}|{'-' * 18}|{'-' * 10}|{'-' * 10}|{'-' * 10}|")
        for r in (r for r in rows if r.size_px == size):
            lines.append(f"| {r.variant:<22} | {r.median_s:>16.3f} | {r.speedup:>7.2f}x | {r.cosine:>8.5f} | {r.rel_l2:>8.4f} |")
    return "\n".join(lines)


def rows_to_json(rows: list[Row], **meta: Any) -> str:
    return json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2)
