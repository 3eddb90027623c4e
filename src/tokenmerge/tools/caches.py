"""Step caches on a denoiser, the accelerators users pick first for DiTs, for whole sampling loops (``bench --steps``
on a transformer, ``eval`` on the reference transformers): diffusers' hooks and cache-dit, each set as its authors
publish it, with the warm-up scaled to the short loops a CPU can time.

- ``fbcache``: diffusers' FirstBlockCache (the first block's residual decides whether the rest is replayed;
  threshold 0.08, ParaAttention's and cache-dit's Flux setting);
- ``taylorseer``: diffusers' TaylorSeerCache (attention outputs predicted by a first-order Taylor series; full
  steps every ``3``, the first quarter of the steps computed);
- ``magcache``: diffusers' MagCache with FLUX.1's published magnitude ratios (``FLUX_MAG_RATIOS``; MagCache reads
  no activations to decide, so the schedule is the ratios', whatever the weights);
- ``fastercache``: diffusers' FasterCache (attention reused every 2nd block-step at high noise; the
  unconditional-batch skip is off: the loops here batch CFG their own way);
- ``pab``: diffusers' PyramidAttentionBroadcast (self-attention reused on alternate steps for timesteps 100-800);
- ``dbcache``: cache-dit's DBCache (F1B0: the first block always computed, the others on the steps of cache-dit's
  ``"fast"`` steps mask, 11 of 28 steps, 5 of 8; TaylorSeer calibrator on the others). A fixed schedule, where
  ``fbcache`` decides by a residual threshold: on random weights (the bench) the residual moves more than any
  published threshold from step to step, so FirstBlockCache computes every step there; it is judged on the
  trained reference models (``eval``);
- ``dbcache-nocal``: the same DBCache without the calibrator (cached steps replay the last computed residual). The
  calibrator extrapolates the residual's change between computed steps, and with ``tome`` that change holds ToMe's
  error, which differs from step to step (the matching follows the tokens): on the Flux-style reference model
  ToMe r=0.3 + ``dbcache`` loses 2.3 dB to ToMe r=0.5 alone, + ``dbcache-nocal`` gains 0.2 dB (docs/stacking.md).

A cache's hooks read the loop's step through :class:`Clock` (the timestep on diffusers' 0-1000 scale) and need
each model call inside ``model.cache_context`` (diffusers); :func:`step_context` gives it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

CACHES = ("fbcache", "taylorseer", "magcache", "fastercache", "pab", "dbcache", "dbcache-nocal")
NAMES = {
    "fbcache": "FirstBlockCache",
    "taylorseer": "TaylorSeer",
    "magcache": "MagCache",
    "fastercache": "FasterCache",
    "pab": "PAB",
    "dbcache": "cache-dit DBCache",
    "dbcache-nocal": "cache-dit DBCache (no calibrator)",
}


@dataclass
class Clock:
    """Where a sampling loop is: its length and the current step's timestep (0-1000, high noise first)."""

    steps: int
    timestep: float = 1000.0
    timesteps: tuple[int, ...] = ()  # a DDIM loop's timesteps, where DeepCache runs without a pipeline (eval)


def _warmup(clock: Clock) -> int:
    return max(1, clock.steps // 4)


def enable_cache(model: torch.nn.Module, name: str, clock: Clock) -> Callable[[], None]:
    """Turn the step cache ``name`` on for ``model`` (a diffusers transformer); returns the function that turns it
    off again (every hook removed)."""
    if name not in CACHES:
        raise ValueError(f"cache must be one of {', '.join(CACHES)}, got {name!r}")
    if not name.startswith("dbcache") and not hasattr(model, "transformer_blocks") and not hasattr(model, "blocks"):
        raise ValueError(
            f"+{name}: diffusers' step caches act on its transformers, not on a {type(model).__name__} (a UNet's is +deepcache)"
        )
    if name.startswith("dbcache"):
        os.environ.setdefault("CACHE_DIT_LOG_LEVEL", "warning")  # not its INFO lines in every table (read at import)
        import cache_dit
        from cache_dit import DBCacheConfig, TaylorSeerCalibratorConfig

        warmup = _warmup(clock)
        config = DBCacheConfig(
            Fn_compute_blocks=1,
            Bn_compute_blocks=0,
            max_warmup_steps=warmup,
            warmup_interval=1,
            residual_diff_threshold=0.08,
            num_inference_steps=clock.steps,
            steps_computation_mask=cache_dit.steps_mask(total_steps=clock.steps, mask_policy="fast"),
            steps_computation_policy="static",
        )
        order = list(model._modules)
        calibrator = TaylorSeerCalibratorConfig(taylorseer_order=1) if name == "dbcache" else None
        cache_dit.enable_cache(model, cache_config=config, calibrator_config=calibrator)

        def off() -> None:
            cache_dit.disable_cache(model)
            _undo_cache_dit(model, order)

        return off
    from diffusers import (
        FasterCacheConfig,
        FirstBlockCacheConfig,
        MagCacheConfig,
        PyramidAttentionBroadcastConfig,
        TaylorSeerCacheConfig,
    )

    now = lambda: clock.timestep  # noqa: E731 (the hooks call it at every step)
    configs: dict[str, Callable[[], Any]] = {
        "fbcache": lambda: FirstBlockCacheConfig(threshold=0.08),
        "taylorseer": lambda: TaylorSeerCacheConfig(
            cache_interval=3, disable_cache_before_step=_warmup(clock), max_order=1, taylor_factors_dtype=torch.float32
        ),
        "magcache": lambda: MagCacheConfig(mag_ratios=_flux_mag_ratios(), num_inference_steps=clock.steps),
        "fastercache": lambda: FasterCacheConfig(
            spatial_attention_block_skip_range=2,
            spatial_attention_timestep_skip_range=(-1, 681),
            current_timestep_callback=now,
            is_guidance_distilled=True,
        ),
        "pab": lambda: PyramidAttentionBroadcastConfig(
            spatial_attention_block_skip_range=2, spatial_attention_timestep_skip_range=(100, 800), current_timestep_callback=now
        ),
    }
    config = configs[name]()
    if hasattr(model, "enable_cache"):
        model.enable_cache(config)
        return model.disable_cache
    return _apply_hooks(model, name, config)  # a transformer without diffusers' CacheMixin (SD3's in 0.42)


def _apply_hooks(model: torch.nn.Module, name: str, config: Any) -> Callable[[], None]:
    """What ``CacheMixin.enable_cache`` / ``disable_cache`` do, for a model class that does not inherit it."""
    from diffusers.hooks import (
        HookRegistry,
        apply_faster_cache,
        apply_first_block_cache,
        apply_mag_cache,
        apply_pyramid_attention_broadcast,
        apply_taylorseer_cache,
    )
    from diffusers.hooks.faster_cache import _FASTER_CACHE_BLOCK_HOOK, _FASTER_CACHE_DENOISER_HOOK
    from diffusers.hooks.first_block_cache import _FBC_BLOCK_HOOK, _FBC_LEADER_BLOCK_HOOK
    from diffusers.hooks.mag_cache import _MAG_CACHE_BLOCK_HOOK, _MAG_CACHE_LEADER_BLOCK_HOOK
    from diffusers.hooks.pyramid_attention_broadcast import _PYRAMID_ATTENTION_BROADCAST_HOOK
    from diffusers.hooks.taylorseer_cache import _TAYLORSEER_CACHE_HOOK

    apply, hooks = {
        "fbcache": (apply_first_block_cache, (_FBC_LEADER_BLOCK_HOOK, _FBC_BLOCK_HOOK)),
        "taylorseer": (apply_taylorseer_cache, (_TAYLORSEER_CACHE_HOOK,)),
        "magcache": (apply_mag_cache, (_MAG_CACHE_LEADER_BLOCK_HOOK, _MAG_CACHE_BLOCK_HOOK)),
        "fastercache": (apply_faster_cache, (_FASTER_CACHE_DENOISER_HOOK, _FASTER_CACHE_BLOCK_HOOK)),
        "pab": (apply_pyramid_attention_broadcast, (_PYRAMID_ATTENTION_BROADCAST_HOOK,)),
    }[name]
    apply(model, config)
    registry = HookRegistry.check_if_exists_or_initialize(model)
    registry.invalidate_child_registries_cache()

    def off() -> None:
        for hook in hooks:
            registry.remove_hook(hook, recurse=True)
        registry.invalidate_child_registries_cache()

    return off


def _undo_cache_dit(model: torch.nn.Module, order: list[str]) -> None:
    """What cache-dit's ``disable_cache`` leaves behind: the forwards its patch functors bound on the transformer and
    its blocks, and its block lists put back last among the children (diffusers' FirstBlockCache takes the first
    child list's first block as the head). Drop the one, restore the other's order."""
    model._modules = {name: model._modules[name] for name in order if name in model._modules} | model._modules
    for module in model.modules():
        forward = vars(module).get("forward")
        if forward is not None and getattr(getattr(forward, "__func__", None), "__module__", "").startswith("cache_dit."):
            del module.forward
    vars(model).pop("_is_patched", None)


def _flux_mag_ratios() -> torch.Tensor:
    from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS

    return FLUX_MAG_RATIOS


@contextlib.contextmanager
def step_context(model: torch.nn.Module, name: str = "cond") -> Iterator[None]:
    """The cache context diffusers' cache hooks need around every model call (pipelines open one per call, through
    ``CacheMixin.cache_context``; here also for a model class without it); nothing for a model without hooks."""
    if getattr(model, "_diffusers_hook", None) is None:
        yield
        return
    from diffusers.hooks.hooks import CacheContext, _set_cache_context

    _set_cache_context(model, CacheContext(name))
    try:
        yield
    finally:
        _set_cache_context(model, None)


def end_loop(model: torch.nn.Module) -> None:
    """What a pipeline does at the end of a call: diffusers' cache hooks drop their state (cache-dit refreshes its
    own once ``num_inference_steps`` steps have run)."""
    registry = getattr(model, "_diffusers_hook", None)
    if registry is not None:
        registry.reset_stateful_hooks(recurse=True)
