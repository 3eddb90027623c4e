"""The step caches on a model that the hooks must know of, read by the names they register in diffusers' hook
registry and the attributes cache-dit sets, never by importing either.

- *Replaying* caches (Pyramid Attention Broadcast, TaylorSeer, FasterCache) wrap a sub-layer and may return its
  output cached in an earlier step: under ``tome`` that output was computed on that step's merged tokens, and this
  step's plan cannot restore it, so a merged span holding one runs unmerged (:mod:`tokenmerge.hooks.tokens`).
  Block-level caches (FirstBlockCache, MagCache, DBCache) replay whole blocks, whose outputs have every token.
- *Deciding* caches compare a block's output across steps to decide whether the blocks after it run: diffusers'
  FirstBlockCache (its head block's residual against a threshold) and cache-dit's DBCache where a threshold
  decides (its first ``Fn_compute_blocks`` blocks). Under ``tome`` that output carries ToMe's error, which differs
  from step to step (the matching follows the tokens; the random partition is drawn per step) by more than the
  threshold, so the cache would reuse no step; such a block runs unmerged (:func:`tokenmerge.planning.decide`).
- *Extrapolating* caches forecast a cached residual from its change between computed steps: cache-dit's calibrators
  (TaylorSeer, FoCa). Under ``tome`` that change holds ToMe's error, different at each step, and the forecast
  magnifies it; the combination runs, and is said once (:class:`tokenmerge.hooks.calls.BeginCall`).
"""

from __future__ import annotations

from typing import Any

import torch

# diffusers hooks (by the name they register under in a module's HookRegistry) that may skip a module and return its
# output cached in an earlier call.
REPLAYING_HOOKS = ("pyramid_attention_broadcast", "taylorseer_cache", "faster_cache_block")
# diffusers' FirstBlockCache: the hook on its head block, whose residual decides whether the other blocks run.
FIRST_BLOCK_HOOK = "fbc_leader_block_hook"


def _hooks(module: torch.nn.Module) -> dict[str, Any]:
    registry = getattr(module, "_diffusers_hook", None)
    return getattr(registry, "hooks", None) or {}


def caching_wrappers(module: torch.nn.Module) -> list[str]:
    """The diffusers hooks on ``module`` that may return an output cached in an earlier call, by registry name."""
    return [name for name in _hooks(module) if name in REPLAYING_HOOKS]


def deciding_cache(root: torch.nn.Module, block: torch.nn.Module, index: int) -> str | None:
    """Which step cache compares ``block``'s output across steps to decide whether the blocks after it run, and by
    which blocks, said as a clause (None: none does). ``index``: the block's position among the denoiser's blocks in
    the order they run; cache-dit's DBCache decides by its first ``Fn_compute_blocks`` blocks, except where a static
    steps mask decides alone."""
    if FIRST_BLOCK_HOOK in _hooks(block):
        return f"diffusers' FirstBlockCache decides by the output of its head block ({index})"
    config = _cache_dit_config(root)
    if config is None or index >= getattr(config, "Fn_compute_blocks", 0):
        return None
    if getattr(getattr(config, "cache_type", None), "name", None) != "DBCache":
        return None
    if getattr(config, "steps_computation_mask", None) is not None and getattr(config, "steps_computation_policy", None) == "static":
        return None  # the mask alone decides: no output is compared
    return f"cache-dit's DBCache decides by the output of its first {config.Fn_compute_blocks} blocks (Fn_compute_blocks)"


def extrapolating_cache(root: torch.nn.Module) -> str | None:
    """The calibrator by which cache-dit forecasts ``root``'s cached residuals, named (None: none is enabled)."""
    calibrator = _cache_dit_kwargs(root).get("calibrator_config")
    if not (getattr(calibrator, "enable_calibrator", False) or getattr(calibrator, "enable_encoder_calibrator", False)):
        return None
    return f"cache-dit's {getattr(calibrator, 'calibrator_type', 'taylorseer')} calibrator"


def _cache_dit_config(root: torch.nn.Module) -> Any:
    """The cache config cache-dit's ``enable_cache`` attached to a transformer (None: it is not cached by cache-dit)."""
    return _cache_dit_kwargs(root).get("cache_config")


def _cache_dit_kwargs(root: torch.nn.Module) -> dict[str, Any]:
    """The context options cache-dit's ``enable_cache`` attached to a transformer (empty: not cached by cache-dit)."""
    kwargs = vars(root).get("_context_kwargs") if vars(root).get("_is_cached", False) else None
    return kwargs if isinstance(kwargs, dict) else {}
