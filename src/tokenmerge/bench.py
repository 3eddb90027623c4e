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
    patch: Callable[[torch.nn.Module], Any]
    unpatch: Callable[[torch.nn.Module], Any]


def _variants(ratio: float, level: int, seed: int) -> list[Variant]:
    variants = [Variant("vanilla", lambda m: None, lambda m: None)]
    if importlib.util.find_spec("tomesd") is not None:
        import tomesd

        variants.append(
            Variant(
                f"tomesd 0.1.3 r={ratio}",
                lambda m: tomesd.apply_patch(m, ratio=ratio, max_downsample=level),
                tomesd.remove_patch,
            )
        )
    variants.append(
        Variant(f"tokenmerge r={ratio}", lambda m: apply_patch(m, ratio=ratio, seed=seed), remove_patch)
    )
    return variants


def _forward(unet: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
    # Positional sample/timestep/context: tomesd reads the latent size from the first positional argument.
    extra = {k: v for k, v in inputs.items() if k not in ("sample", "timestep", "encoder_hidden_states")}
    with torch.inference_mode():
        return unet(inputs["sample"], inputs["timestep"], inputs["encoder_hidden_states"], **extra).sample


def _fidelity(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    a, b = out.double().flatten(), ref.double().flatten()
    cosine = torch.nn.functional.cosine_similarity(a, b, dim=0).item()
    return cosine, ((a - b).norm() / b.norm()).item()


def _progress(total: int):
    try:
        from tqdm import tqdm

        return tqdm(total=total, unit="forward", desc="bench", leave=False)
    except ImportError:  # tqdm comes with the diffusers extra; run without a bar otherwise
        return None


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
    started = time.perf_counter()
    unet = build_unet(model, small=small, seed=seed)
    log(f"built {model}{' (small)' if small else ''} UNet with random weights in {time.perf_counter() - started:.1f} s")
    apply_patch(unet, ratio=ratio)
    level = unet._tokenmerge_state.top_level  # the level tokenmerge's auto mode merges; tomesd gets the same
    remove_patch(unet)
    variants = _variants(ratio, level, seed)
    bar = _progress(len(sizes_px) * len(variants) * (repeats + 1))
    rows: list[Row] = []
    for size in sizes_px:
        inputs = unet_inputs(unet, size // 8, size // 8, batch=batch, seed=seed)
        outputs: dict[str, torch.Tensor] = {}
        times: dict[str, list[float]] = {v.name: [] for v in variants}
        for rep in range(repeats + 1):  # the first round warms up and records outputs
            for variant in variants:
                variant.patch(unet)
                t0 = time.perf_counter()
                out = _forward(unet, inputs)
                elapsed = time.perf_counter() - t0
                variant.unpatch(unet)
                if rep == 0:
                    outputs[variant.name] = out
                else:
                    times[variant.name].append(elapsed)
                if bar is not None:
                    bar.update(1)
        base = statistics.median(times["vanilla"])
        for variant in variants:
            median = statistics.median(times[variant.name])
            cosine, rel_l2 = _fidelity(outputs[variant.name], outputs["vanilla"])
            rows.append(Row(size, variant.name, median, base / median, cosine, rel_l2))
    if bar is not None:
        bar.close()
    return rows


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
