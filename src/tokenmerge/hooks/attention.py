"""Hooks that downsample the image keys and values of an attention (``method="todo"`` / ``"auto"``).

Two routes to the same keys and values (see :mod:`tokenmerge.algorithms.downsample`):

- a plain self-attention that takes a key/value source keyword (diffusers' ``encoder_hidden_states``,
  ldm's ``context``) gets a downsampled copy of its tokens there: its key and value projections run on
  fewer tokens;
- elsewhere (joint text+image attention, fused projections, rotary positions applied inside the processor)
  the keys and values are downsampled where the attention computes them, at
  ``torch.nn.functional.scaled_dot_product_attention``, through a TorchFunctionMode entered for the duration
  of that attention module's call (thread-local, so concurrent calls are unaffected).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..algorithms import downsample_keys, downsample_mask_columns, downsample_tokens
from .calls import first_tensor
from .state import BlockWarnings, PatchState

_SDPA = F.scaled_dot_product_attention
_SDPA_NAMES = ("query", "key", "value", "attn_mask")


def projections_fused(attention: torch.nn.Module) -> bool:
    """diffusers attention whose q/k/v projections are fused (``fuse_qkv_projections``): no ``to_kv`` for a
    separate key/value source. The processor, not ``fused_projections``, says it (unfusing keeps the flag)."""
    processor = getattr(attention, "processor", None)
    if processor is not None and type(processor).__name__.startswith("Fused"):
        return True
    return bool(getattr(attention, "fused_projections", False)) and not hasattr(attention, "to_kv") and processor is None


class ReduceKeysValues(TorchFunctionMode):
    """Downsamples the image part of the keys and values of every SDPA call made while it is active, unless
    the key and value projections already ran on downsampled image tokens (``projected``)."""

    def __init__(self, grid: tuple[int, int], factor: int, interpolation: str, image_first: bool, projections: bool) -> None:
        super().__init__()
        self.grid, self.factor, self.interpolation, self.image_first = grid, factor, interpolation, image_first
        self.projections = projections  # the attention's to_k / to_v may downsample their inputs
        self.projected = 0
        self.reduced = 0
        self.mask_skipped = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not _SDPA:
            return func(*args, **kwargs)
        if self.projected:  # keys and values were computed from downsampled image tokens already
            self.reduced += 1
            return func(*args, **kwargs)
        values = dict(zip(_SDPA_NAMES, args))
        values.update({k: v for k, v in kwargs.items() if k in _SDPA_NAMES})
        rest = {k: v for k, v in kwargs.items() if k not in _SDPA_NAMES}
        rest.update({k: v for k, v in zip(_SDPA_NAMES, args) if k not in values})
        key, value, mask = values["key"], values["value"], values.get("attn_mask")
        n = self.grid[0] * self.grid[1]
        if key.shape[-2] < n:  # no image grid among these keys (a cross-attention, IP-adapter tokens)
            return func(*args, **kwargs)
        if mask is not None and mask.shape[-1] == key.shape[-2]:
            if not self.interpolation.startswith("nearest"):
                self.mask_skipped = True
                return func(*args, **kwargs)
            mask = downsample_mask_columns(mask, self.grid, self.factor, self.interpolation, self.image_first)
        key = downsample_keys(key, self.grid, self.factor, self.interpolation, self.image_first)
        value = downsample_keys(value, self.grid, self.factor, self.interpolation, self.image_first)
        self.reduced += 1
        return func(values["query"], key, value, **({"attn_mask": mask} if "attn_mask" in values else {}), **rest)


class DownsampleKeysValues:
    """Pre-hook on an attention: hand it downsampled keys/values (keyword route) or enter the SDPA mode."""

    def __init__(self, patch: PatchState, block: int, site: int) -> None:
        self.patch = patch
        self.block = block
        self.site = site
        self.warnings = BlockWarnings(block)

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]):
        call = self.patch.current()
        block = None if call is None else call.blocks.get(self.block)
        action = None if block is None else block.action
        if action is None or action.kv_grid is None:
            return None
        site = self.patch.blocks[self.block].layout.kv_sites[self.site]
        (h, w), factor, interpolation = action.kv_grid, action.kv_factor, call.config.kv_interpolation
        if site.context_kwarg is not None:
            if kwargs.get(site.context_kwarg) is not None:  # this attention attends to a context already
                return None
            if site.mask_kwarg is not None and kwargs.get(site.mask_kwarg) is not None:
                self.warnings.warn_once("an attention mask over the tokens is set; its keys and values are not downsampled")
                return None
            if not projections_fused(module):
                kv = downsample_tokens(first_tensor(args, kwargs), h, w, factor, interpolation)
                return args, {**kwargs, site.context_kwarg: kv}
        mode = ReduceKeysValues((h, w), factor, interpolation, site.image_first, bool(site.projections) and not projections_fused(module))
        mode.__enter__()
        self.patch.open_mode(module, mode)
        return None


class CloseKeyValueMode:
    """Forward hook (always called) on an attention: leave the SDPA mode its pre-hook entered."""

    def __init__(self, patch: PatchState, block: int) -> None:
        self.patch = patch
        self.warnings = BlockWarnings(block)

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        mode = self.patch.close_mode(module)
        if mode is None:
            return
        mode.__exit__(None, None, None)
        if (mode.reduced == 0 or mode.mask_skipped) and not torch.compiler.is_compiling():
            reason = (
                "an attention mask is set and kv_interpolation is not nearest"
                if mode.mask_skipped
                else "it does not call torch's scaled_dot_product_attention (another attention backend?)"
            )
            self.warnings.warn_once(f"keys and values were not downsampled: {reason}", stacklevel=3)


class DownsampleProjectionInput:
    """Pre-hook on a key or value projection (SD3's ``to_k`` / ``to_v``): while its attention's SDPA mode allows
    it, project downsampled image tokens (the same keys as downsampling after the projection, fewer FLOPs)."""

    def __init__(self, patch: PatchState, attention: torch.nn.Module) -> None:
        self.patch = patch
        self.attention = attention

    def __call__(self, module: torch.nn.Module, args: tuple):
        mode = self.patch.open_mode_of(self.attention)
        if mode is None or not mode.projections or not args:
            return None
        x = args[0]
        h, w = mode.grid
        if x.ndim != 3 or x.shape[1] != h * w:
            return None
        mode.projected += 1
        return (downsample_tokens(x, h, w, mode.factor, mode.interpolation), *args[1:])
