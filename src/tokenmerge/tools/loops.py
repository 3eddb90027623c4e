"""Whole sampling loops of a bench transformer (``tokenmerge bench --steps N`` on a DiT): flow-matching Euler steps
from sigma 1 to 0 on the inputs its family's example builds (as its pipeline passes them), each model call inside
the cache context diffusers' step caches need, so that tokenmerge, a cache (:mod:`tokenmerge.tools.caches`) and the
two together are timed on the same work. No scheduler shift, no CFG beyond the example's batch: the loop is a
timing harness, not a sampler to look at (quality comes from the reference models, ``tokenmerge eval``)."""

from __future__ import annotations

from typing import Any

import torch

from .architectures import TIMESTEP_KEYS, at_noise, timestep_scale, transformer_output
from .caches import Clock, end_loop, step_context

LATENT = "hidden_states"


def flow_loop(model: torch.nn.Module, name: str, inputs: dict[str, Any], clock: Clock) -> torch.Tensor:
    """``clock.steps`` Euler steps of the flow ``x' = v(x, t)`` from the example's latent; returns the final latent.
    Each step's timestep is its sigma on the family's scale (:func:`~tokenmerge.tools.architectures.at_noise`:
    Lumina 2 and Z-Image count from noise to clean)."""
    if LATENT not in inputs or not any(k in inputs for k in TIMESTEP_KEYS):
        raise ValueError(f"--steps on a transformer needs its {LATENT} and timestep inputs; {name}'s example has {', '.join(inputs)}")
    x = inputs[LATENT].clone()
    scale = timestep_scale(model)
    sigmas = torch.linspace(1.0, 0.0, clock.steps + 1)
    try:
        for i in range(clock.steps):
            sigma, after = float(sigmas[i]), float(sigmas[i + 1])
            clock.timestep = sigma * 1000.0
            with torch.inference_mode(), step_context(model):
                velocity = transformer_output(name, model(**{**at_noise(inputs, scale, sigma), LATENT: x}))
            if velocity.shape != x.shape:
                raise ValueError(f"--steps: {name}'s output {tuple(velocity.shape)} is not shaped as its latent {tuple(x.shape)}")
            x = x + (after - sigma) * velocity
    finally:
        end_loop(model)
    return x
