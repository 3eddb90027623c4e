"""Hooks on an attention: downsample its image keys and values (``method="todo"`` / ``"auto"``), or, inside a span
that gathered some image tokens and fills keys, give it every token's (:meth:`tokenmerge.algorithms.TokenSpan.fill_keys`).

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

from ..algorithms import TokenLayout, downsample_tokens, reduce_keys_values
from . import dispatch
from .calls import first_tensor
from .modes import call_through
from .sites import keyword_route, projections_fused
from .state import BlockWarnings, PatchState
from .step_caches import caching_wrappers

_SDPA = F.scaled_dot_product_attention
_SDPA_NAMES = ("query", "key", "value", "attn_mask")


class KeyValueMode(TorchFunctionMode):
    """A mode active for one attention call that changes the keys and values it attends to (:meth:`reduce`), at torch's
    ``scaled_dot_product_attention`` (as a TorchFunctionMode) and in front of every diffusers ``dispatch_attention_fn``
    backend (:mod:`tokenmerge.hooks.dispatch` calls :meth:`reduce` and marks the call ``dispatching``, so that a
    backend built on SDPA is not changed twice). ``reduced`` counts the calls it changed."""

    def __init__(self, layout: TokenLayout) -> None:
        super().__init__()
        self.layout = layout
        self.reduced = 0
        self.dispatching = 0
        self.mask_skipped = False

    def reduce(self, key: torch.Tensor, value: torch.Tensor, mask: Any) -> tuple[torch.Tensor, torch.Tensor, Any] | None:
        """(B, H, S, D) keys and values and their mask, changed; ``None`` where they stay as they are."""
        raise NotImplementedError

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not _SDPA or self.dispatching:
            return call_through(func, args, kwargs)
        values = dict(zip(_SDPA_NAMES, args))
        values.update({k: v for k, v in kwargs.items() if k in _SDPA_NAMES})
        rest = {k: v for k, v in kwargs.items() if k not in _SDPA_NAMES}
        rest.update({k: v for k, v in zip(_SDPA_NAMES, args) if k not in values})
        found = self.reduce(values["key"], values["value"], values.get("attn_mask"))
        if found is None:
            return func(*args, **kwargs)
        key, value, mask = found
        return func(values["query"], key, value, **({"attn_mask": mask} if "attn_mask" in values else {}), **rest)


class ReduceKeysValues(KeyValueMode):
    """One attention call's key/value reduction: the image segment of its keys and values (and the matching mask
    columns) downsampled, whichever route computes the attention.

    Routes: as a TorchFunctionMode it reduces torch's ``scaled_dot_product_attention`` calls made while it is
    active (processors that call SDPA themselves); diffusers' ``dispatch_attention_fn`` backends are reached by
    :mod:`tokenmerge.hooks.dispatch`, which calls :meth:`reduce` in front of whichever backend runs and marks the
    call ``dispatching`` so that a backend built on SDPA is not reduced twice. Nothing is reduced where the key and
    value projections already ran on downsampled image tokens (``projected``)."""

    def __init__(
        self, layout: TokenLayout, factors: tuple[int, ...], interpolation: str, projections: bool, keep: torch.Tensor | None = None
    ) -> None:
        super().__init__(layout)
        self.grid, self.factors, self.interpolation = layout.grid, factors, interpolation
        self.start = layout.image_start
        self.keep = keep  # sequence parallelism: the rank's image positions to keep (the whole grid's selection)
        self.projections = projections  # the attention's to_k / to_v may downsample their inputs
        self.projected = 0

    def reduce(self, key: torch.Tensor, value: torch.Tensor, mask: Any) -> tuple[torch.Tensor, torch.Tensor, Any] | None:
        """(B, H, S, D) keys and values and their mask, reduced; ``None`` where they stay as they are (another
        sequence than this attention's, a mask that cannot follow, projections that reduced them already)."""
        if self.projected:  # keys and values were computed from downsampled image tokens already
            self.reduced += 1
            return None
        if key.shape[-2] != self.layout.total:  # not this attention's sequence (a cross-attention, IP-adapter tokens)
            return None
        if mask is not None and not isinstance(mask, torch.Tensor):  # a flex BlockMask: no columns to select
            return None
        columns = None if self.keep is None else self.layout.kept_rows(self.keep.to(key.device))
        found = reduce_keys_values(key, value, mask, self.start, self.grid, self.factors, self.interpolation, columns=columns)
        if found is None:  # a mask over the keys, and an interpolation that does not select
            self.mask_skipped = True
            return None
        self.reduced += 1
        return found


class FillKeysValues(KeyValueMode):
    """One attention call inside a span that gathered some image tokens and fills keys: the keys and values the
    attention computed for the gathered tokens are put among those of every image token the span keeps for this site
    (:meth:`tokenmerge.algorithms.TokenSpan.fill_keys`), so that its queries attend to every token."""

    def __init__(self, layout: TokenLayout, span: Any, site: int) -> None:
        super().__init__(layout)
        self.span, self.site = span, site
        self.length = layout.total - span.num_tokens + span.num_kept  # the gathered sequence's length

    @torch.compiler.disable  # (the cache is Python state: outside compiled code, as the stateful hooks)
    def reduce(self, key: torch.Tensor, value: torch.Tensor, mask: Any) -> tuple[torch.Tensor, torch.Tensor, Any] | None:
        if key.shape[-2] != self.length or (mask is not None and not isinstance(mask, torch.Tensor)):
            return None
        self.reduced += 1
        return self.span.fill_keys(self.site, key, value, mask, self.layout.image_start)


class DownsampleKeysValues:
    """Pre-hook on an attention: hand it downsampled keys/values (keyword route) or enter the SDPA mode."""

    def __init__(self, patch: PatchState, block: int, site: int) -> None:
        self.patch = patch
        self.site = site
        self.warnings = BlockWarnings(patch, block)

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]):
        call = self.patch.current()
        block = None if call is None else call.running  # (not looked up by index: see CallState.running)
        action = None if block is None else block.action
        if action is not None and block.layout is not None and action.plan is not None and action.plan.fills_keys:
            return self._fill(module, args, kwargs, block, action.plan)
        if action is None or action.kv_grid is None or block.layout is None:
            return None
        site = block.info.layout.kv_sites[self.site]
        grid, factors, interpolation = action.kv_grid, action.kv_factors, call.config.kv_interpolation
        sharded = block.layout.shard is not None  # a rank's part: reduced where the attention runs, as one process would
        if site.context_kwarg is not None and not sharded:
            if kwargs.get(site.context_kwarg) is not None:  # this attention attends to a context already
                return None
            if site.mask_kwarg is not None and kwargs.get(site.mask_kwarg) is not None:
                self.warnings.warn_once("kv mask", "an attention mask over the tokens is set; its keys and values are not downsampled")
                return None
            if not projections_fused(module):
                kv = downsample_tokens(first_tensor(args, kwargs), grid, factors, interpolation)
                return args, {**kwargs, site.context_kwarg: kv}
        layout = block.layout.stream(site.stream)
        projections = bool(site.projections) and not projections_fused(module) and not sharded
        mode = ReduceKeysValues(layout, factors, interpolation, projections, action.kv_keep)
        mode.__enter__()
        self.patch.open_mode(module, mode)
        dispatch.ACTIVE.stack.append(mode)
        return None

    def _fill(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any], block: Any, span: Any):
        """Inside a span that gathered image tokens: give the attention every token's keys and values. A plain
        self-attention taking them by keyword projects them from every token's input (exact); elsewhere the mode
        :class:`FillKeysValues` puts the gathered tokens' among those the span keeps."""
        site = block.info.layout.kv_sites[self.site]
        if keyword_route(site):
            if kwargs.get(site.context_kwarg) is not None:  # it attends to a context already
                return None
            full = next((block.inputs[s] for s, sp in enumerate(block.info.layout.spans) if sp.enter is module and s in block.inputs), None)
            return None if full is None or span.whole else (args, {**kwargs, site.context_kwarg: full})
        mode = FillKeysValues(block.layout.stream(site.stream), span, self.site)
        mode.__enter__()
        self.patch.open_mode(module, mode)
        dispatch.ACTIVE.stack.append(mode)
        return None


class CloseKeyValueMode:
    """Forward hook on an attention: leave the SDPA mode its pre-hook entered. (Where the attention raises, the
    call's :class:`~tokenmerge.hooks.calls.EndCall` leaves it: an always-called hook here would be a guard on its
    handle's id in a compiled block, one graph per block.)"""

    def __init__(self, patch: PatchState, block: int) -> None:
        self.patch = patch
        self.warnings = BlockWarnings(patch, block)

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        mode = self.patch.close_mode(module, KeyValueMode)
        if mode is None:
            return
        dispatch.exit_mode(mode)
        if (mode.reduced == 0 or mode.mask_skipped) and not torch.compiler.is_compiling() and not caching_wrappers(module):
            # (a caching hook that returned an output of an earlier step ran no attention: nothing to reduce)
            reason = (
                "an attention mask is set and kv_interpolation is not nearest"
                if mode.mask_skipped
                else "its attention is neither torch's scaled_dot_product_attention nor a diffusers dispatch backend, or its "
                f"keys are not the {mode.layout.total} tokens of its call's layout ({mode.layout})"
            )
            self.warnings.warn_once("kv not reached", f"keys and values were not downsampled: {reason}")


class DownsampleProjectionInput:
    """Pre-hook on a key or value projection (SD3's ``to_k`` / ``to_v``): while its attention's SDPA mode allows
    it, project downsampled image tokens (the same keys as downsampling after the projection, fewer FLOPs)."""

    def __init__(self, patch: PatchState, attention: torch.nn.Module) -> None:
        self.patch = patch
        self.attention = attention

    def __call__(self, module: torch.nn.Module, args: tuple):
        mode = self.patch.open_mode_of(self.attention, ReduceKeysValues)
        if mode is None or not mode.projections or not args:
            return None
        x = args[0]
        if x.ndim != 3 or x.shape[1] != mode.grid.numel:
            return None
        mode.projected += 1
        return (downsample_tokens(x, mode.grid, mode.factors, mode.interpolation), *args[1:])
