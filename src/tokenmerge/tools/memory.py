"""What the token cache holds across a generation, in machine-independent units: the most bytes its caches held
at once, over batch x image tokens x patched blocks x width x the model's element size (one token's activations in
every patched block). Counted on the shipped reference models, in the dtype a GPU runs them in (bfloat16)."""

from __future__ import annotations

from typing import Any

import torch

import tokenmerge

from ..hooks import states_in


def cache_units(kind: str = "flux", dtype: torch.dtype = torch.bfloat16, steps: int = 28, seed: int = 0, **options: Any) -> dict[str, Any]:
    """One CFG generation of the ``kind`` reference model (batch 1 as a batch of 2) with the token cache under
    ``options``: the most bytes held after any of its calls, and those bytes in units (see the module)."""
    from .reference.models import load_reference, native_size, sample, shipped

    model = load_reference(shipped(kind)).to(dtype)
    size = native_size(kind)
    g = torch.Generator().manual_seed(seed)
    shape = (1, 3, 4, size, size) if model.is_video else (1, 3, size, size)
    noise = torch.randn(shape, generator=g).to(dtype)
    labels = torch.tensor([seed % model.num_classes])
    tokenmerge.apply_patch(model.denoiser, method="tokencache", **options)
    (state,) = [s for _, s in states_in([model.denoiser])]
    peak = {"bytes": 0, "tokens": 0, "batch": 0}

    def watch(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        held = state.cache_bytes()
        if held > peak["bytes"]:
            slots = [s for s in state.generations().slots if s.inputs]
            peak.update(bytes=held, tokens=max(t.shape[1] for s in slots for t in s.inputs.values()), batch=slots[0].key[0])

    handle = model.denoiser.register_forward_hook(watch, with_kwargs=True)
    try:
        sample(model, labels, noise, steps=steps)
    finally:
        handle.remove()
        tokenmerge.remove_patch(model.denoiser)
    config = model.denoiser.config
    width = config.num_attention_heads * config.attention_head_dim
    blocks = len(state.blocks)
    unit = peak["batch"] * peak["tokens"] * blocks * width * torch.empty((), dtype=dtype).element_size()
    return {**peak, "blocks": blocks, "width": width, "units": peak["bytes"] / unit if unit else 0.0}
