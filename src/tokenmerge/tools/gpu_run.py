"""The prepared GPU run (``tokenmerge gpu-run --out gpu.json``): Flux.1 [dev] and Wan 2.1 1.3B transformers at their
published widths with random weights, bfloat16, torch's SDPA, whole 28-step flow loops at 1024 px and 480x832 px x 33
frames: vanilla, ToMe r=0.5 and the token cache (default, fast, memory="low"), each eager and with its blocks compiled
(diffusers' ``compile_repeated_blocks``). Per generation: wall time, the peak of ``torch.cuda.max_memory_allocated``
beyond the model's weights, the device syncs per step (``torch.cuda.set_sync_debug_mode``) and what tokenmerge said.
Meant for one GPU in at most 8 minutes; ``--tiny`` runs the same on the CPU at tiny sizes (the tests do)."""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

import tokenmerge

from .architectures import transformer_inputs, unet_config
from .caches import Clock
from .examples import examples
from .loops import flow_loop

VARIANTS: dict[str, dict[str, Any] | None] = {
    "vanilla": None,
    "tome:0.5": {"ratio": 0.5},
    "tokencache": {"method": "tokencache"},
    "tokencache fast": {"method": "tokencache", "recompute": 0.05, "refresh_every": 14, "full_steps": 2},
    "tokencache low memory": {"method": "tokencache", "memory": "low"},
}
# model -> (latent height, width, latent frames or None): 1024 px (Flux's 8x VAE) and 480x832 px x 33 frames (Wan's
# 8x spatial, 4x temporal VAE: 9 latent frames)
SIZES = {"flux": (128, 128, None), "wan": (60, 104, 9)}
TINY = {"flux": (8, 8, None), "wan": (4, 4, 3)}


@dataclass
class Row:
    model: str
    variant: str
    compiled: bool
    seconds: float
    peak_bytes: int | None  # beyond the weights (CUDA only)
    syncs_per_step: float | None  # device syncs per step (CUDA only)
    said: list[str] = field(default_factory=list)  # what tokenmerge warned


def build(name: str, tiny: bool, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """``name``'s published transformer (tiny: its test config), built on ``device`` in ``dtype`` directly (random
    weights, no float32 copy of a 12B model on the way)."""
    import diffusers

    example = examples()[name][1]
    previous = torch.get_default_dtype()
    torch.manual_seed(0)
    torch.set_default_dtype(dtype)
    try:
        with device:
            return getattr(diffusers, example.cls)(**unet_config(name, small=tiny)).eval()
    finally:
        torch.set_default_dtype(previous)


def generation(model: torch.nn.Module, name: str, inputs: dict[str, Any], steps: int) -> torch.Tensor:
    return flow_loop(model, name, inputs, Clock(steps))


def measure(
    model: torch.nn.Module, name: str, inputs: dict[str, Any], steps: int, device: torch.device
) -> tuple[float, int | None, float | None, list[str]]:
    """One timed generation: seconds, peak bytes beyond what was allocated before it, syncs per step, notices."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        try:
            generation(model, name, inputs, steps)
            if cuda:
                torch.cuda.synchronize()
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
        seconds = time.perf_counter() - start
    syncs = sum("synchroniz" in str(w.message).lower() for w in caught) / steps if cuda else None
    said = sorted({str(w.message) for w in caught if "tokenmerge" in str(w.message)})
    peak = torch.cuda.max_memory_allocated() - before if cuda else None
    return seconds, peak, syncs, said


def run(
    models: tuple[str, ...] = ("flux", "wan"),
    variants: tuple[str, ...] = tuple(VARIANTS),
    steps: int = 28,
    tiny: bool = False,
    compiled: tuple[bool, ...] = (False, True),
) -> list[Row]:
    """Every model x variant x (eager, compiled): a warm-up generation, then one timed generation of ``steps``
    steps."""
    device = torch.device("cuda" if torch.cuda.is_available() and not tiny else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = []
    for name in models:
        model = build(name, tiny, device, dtype)
        height, width, frames = (TINY if tiny else SIZES)[name]
        extra = {} if frames is None else {"frames": frames}
        inputs = {
            k: v.to(device) if isinstance(v, torch.Tensor) else v
            for k, v in transformer_inputs(model, name, height, width, batch=1, **extra).items()
        }
        for compile_blocks in compiled:
            for variant in variants:
                rows.append(_variant(model, name, inputs, variant, compile_blocks, steps, tiny, device))
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _variant(
    model: torch.nn.Module,
    name: str,
    inputs: dict[str, Any],
    variant: str,
    compile_blocks: bool,
    steps: int,
    tiny: bool,
    device: torch.device,
) -> Row:
    """One variant: patched, then its blocks compiled (a graph compiled before a patch ignores it), a warm-up
    generation (2 steps; compiled, a whole one: every graph it needs), one timed generation; then unpatched and
    uncompiled."""
    options = VARIANTS[variant]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if options is not None:
                tokenmerge.apply_patch(model, **options)
            if compile_blocks:
                model.compile_repeated_blocks(**({"backend": "eager"} if tiny else {}))
            generation(model, name, inputs, steps if compile_blocks else 2)  # (compiled: every graph it will need)
        row = Row(name, variant, compile_blocks, *measure(model, name, inputs, steps, device))
        row.said = sorted({*row.said, *(str(w.message) for w in caught if "tokenmerge" in str(w.message))})
        return row
    finally:
        tokenmerge.remove_patch(model)
        if compile_blocks:
            for module in model.modules():
                module._compiled_call_impl = None
            torch._dynamo.reset()


def write(rows: list[Row], out: str | Path) -> dict[str, Any]:
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    found = {"device": device, "torch": torch.__version__, "rows": [asdict(r) for r in rows]}
    Path(out).write_text(json.dumps(found, indent=1))
    return found
