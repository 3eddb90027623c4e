"""Whole sampling loops of a bench transformer (``tokenmerge bench --steps N`` on a DiT): flow-matching Euler steps
from sigma 1 to 0 on the inputs its family's example builds (as its pipeline passes them), each model call inside
the cache context diffusers' step caches need, so that tokenmerge, a cache (:mod:`tokenmerge.tools.caches`) and the
two together are timed on the same work. By default evenly spaced sigmas (no scheduler shift), or a published few-step
model's own (:mod:`tokenmerge.tools.distilled`); no CFG beyond the example's batch: the loop is a timing harness, not
a sampler to look at (quality comes from the reference models, ``tokenmerge eval``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .architectures import TIMESTEP_KEYS, at_noise, timestep_scale, transformer_output
from .caches import Clock, end_loop, step_context

LATENTS = ("hidden_states", "x")  # the names the families' examples give their latent (Z-Image: x, a per-sample list)


def flow_loop(
    model: torch.nn.Module, name: str, inputs: dict[str, Any], clock: Clock, sigmas: Sequence[float] | None = None
) -> torch.Tensor:
    """``clock.steps`` Euler steps of the flow ``x' = v(x, t)`` from the example's latent, at ``sigmas`` (the
    ``clock.steps`` steps' noise levels and the final 0; default: evenly spaced from 1); returns the final latent.
    Each step's timestep is its sigma on the family's scale (:func:`~tokenmerge.tools.architectures.at_noise`:
    Lumina 2 and Z-Image count from noise to clean)."""
    key = next((k for k in LATENTS if k in inputs), None)
    if key is None or not any(k in inputs for k in TIMESTEP_KEYS):
        raise ValueError(f"--steps on a transformer needs its latent and timestep inputs; {name}'s example has {', '.join(inputs)}")
    levels = torch.linspace(1.0, 0.0, clock.steps + 1).tolist() if sigmas is None else [float(s) for s in sigmas]
    if len(levels) != clock.steps + 1:
        raise ValueError(f"--steps {clock.steps} needs {clock.steps + 1} sigmas (the last 0), got {len(levels)}")
    listed = isinstance(inputs[key], list)
    x = torch.stack(inputs[key]) if listed else inputs[key].clone()
    scale = timestep_scale(model)
    try:
        for i in range(clock.steps):
            sigma, after = levels[i], levels[i + 1]
            clock.timestep = sigma * 1000.0
            latent = list(x.unbind(0)) if listed else x
            with torch.inference_mode(), step_context(model):
                velocity = transformer_output(name, model(**{**at_noise(inputs, scale, sigma), key: latent}))
            if velocity.numel() != x.numel():
                raise ValueError(f"--steps: {name}'s output {tuple(velocity.shape)} is not shaped as its latent {tuple(x.shape)}")
            x = x + (after - sigma) * velocity.reshape(x.shape)
    finally:
        end_loop(model)
    return x
