"""The step caches on a model that the hooks must know of, read by the names they register in diffusers' hook
registry and the attributes cache-dit sets, never by importing either.

- *Replaying* caches (Pyramid Attention Broadcast, TaylorSeer, FasterCache) wrap a sub-layer and may return its
  output cached in an earlier step: under ``tome`` that output was computed on that step's merged tokens, and this
  step's plan cannot restore it, so a merged span holding one runs unmerged (:mod:`tokenmerge.hooks.tokens`).
  Block-level caches (FirstBlockCache, MagCache, DBCache) replay whole blocks, whose outputs have every token.
- *Deciding* caches compare a block's output across steps to decide whether the blocks after it run: diffusers'
  FirstBlockCache (its head block's residual against a threshold) and cache-dit's DBCache where a threshold
  decides (the first ``Fn_compute_blocks`` blocks of each list it caches, one cache context per list). Under
  ``tome`` that output carries ToMe's error, which differs from step to step (the matching follows the tokens)
  by more than the threshold, so the cache would reuse no step; such a block runs unmerged
  (:func:`tokenmerge.planning.decide`).
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
# cache-dit's block lists on a transformer: id(block) -> (the list's attribute name, position in it, its cache config).
CacheDitLists = dict[int, tuple[str, int, Any]]


def _hooks(module: torch.nn.Module) -> dict[str, Any]:
    registry = getattr(module, "_diffusers_hook", None)
    return getattr(registry, "hooks", None) or {}


def caching_wrappers(module: torch.nn.Module) -> list[str]:
    """The diffusers hooks on ``module`` that may return an output cached in an earlier call, by registry name."""
    return [name for name in _hooks(module) if name in REPLAYING_HOOKS]


def deciding_cache(root: torch.nn.Module, block: torch.nn.Module, index: int, lists: CacheDitLists | None) -> str | None:
    """Which step cache compares ``block``'s output across steps to decide whether the blocks after it run, and by
    which blocks, said as a clause (None: none does). cache-dit's DBCache decides by the first ``Fn_compute_blocks``
    blocks of each list it caches (one cache context per list), except where a static steps mask decides alone.
    ``lists``: :func:`cache_dit_lists` of ``root`` at the call's start; None where its lists are not ``root``'s own
    (Flux's, joined into one: then ``index``, the block's position in the order the denoiser runs them, counts)."""
    if FIRST_BLOCK_HOOK in _hooks(block):
        return f"diffusers' FirstBlockCache decides by the output of its head block ({index})"
    if lists is None:
        name, position, config = "its blocks", index, _cache_dit_kwargs(root).get("cache_config")
    elif id(block) in lists:
        name, position, config = lists[id(block)]
    else:
        return None
    if config is None or position >= getattr(config, "Fn_compute_blocks", 0):
        return None
    if getattr(getattr(config, "cache_type", None), "name", None) != "DBCache":
        return None
    if getattr(config, "steps_computation_mask", None) is not None and getattr(config, "steps_computation_policy", None) == "static":
        return None  # the mask alone decides: no output is compared
    return f"cache-dit's DBCache decides by the output of the first {config.Fn_compute_blocks} of {name} (Fn_compute_blocks)"


def cache_dit_lists(root: torch.nn.Module) -> CacheDitLists | None:
    """The blocks of the lists cache-dit caches on ``root``, by ``id``: the list's attribute name, the position in it
    and its cache config; None where none of ``root``'s own lists carries a cache context (not cached, or Flux's lists
    joined into one).
    Read at the call's start: inside the forward, cache-dit swaps the lists for its wrappers."""
    if not _cache_dit_kwargs(root):
        return None
    lists: CacheDitLists = {}
    for name, child in root.named_children():
        kwargs = _cache_dit_kwargs(child, cached=True) if isinstance(child, torch.nn.ModuleList) else {}
        if kwargs:
            lists.update((id(block), (name, position, kwargs.get("cache_config"))) for position, block in enumerate(child))
    return lists or None


def extrapolating_cache(root: torch.nn.Module) -> str | None:
    """The calibrator by which cache-dit forecasts ``root``'s cached residuals, named (None: none is enabled)."""
    calibrator = _cache_dit_kwargs(root).get("calibrator_config")
    if not (getattr(calibrator, "enable_calibrator", False) or getattr(calibrator, "enable_encoder_calibrator", False)):
        return None
    return f"cache-dit's {getattr(calibrator, 'calibrator_type', 'taylorseer')} calibrator"


def _cache_dit_kwargs(module: torch.nn.Module, cached: bool = False) -> dict[str, Any]:
    """The context options cache-dit's ``enable_cache`` attached to a transformer, or to one of its block lists
    (``cached``: no flag to check; empty: not cached by cache-dit)."""
    kwargs = vars(module).get("_context_kwargs") if cached or vars(module).get("_is_cached", False) else None
    return kwargs if isinstance(kwargs, dict) else {}
