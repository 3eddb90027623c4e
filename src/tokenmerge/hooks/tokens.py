"""Hooks that merge a block's image tokens on entering a span and restore them on leaving it (ToMe)."""

from __future__ import annotations

from typing import Any

import torch

from ..algorithms import MergePlan
from .calls import first_tensor, replace_first
from .state import BlockCall, BlockWarnings, PatchState

# diffusers hooks that may skip a module and return an output cached in an earlier call: such an output was
# computed on the merged tokens of that call, and unmerging it with this call's plan would scramble it.
_CACHING_HOOKS = ("Cache", "Broadcast", "FBC", "TaylorSeer")


def caching_wrappers(module: torch.nn.Module) -> list[str]:
    """Names of diffusers caching hooks (PyramidAttentionBroadcast, FasterCache, ...) wrapping ``module``."""
    registry = getattr(module, "_diffusers_hook", None)
    hooks = getattr(registry, "hooks", None) or {}
    return [type(h).__name__ for h in hooks.values() if any(word in type(h).__name__ for word in _CACHING_HOOKS)]


def refuse_caching_wrappers(module: torch.nn.Module, where: str) -> None:
    found = caching_wrappers(module)
    if found:
        raise RuntimeError(
            f"tokenmerge: {where} is wrapped by {', '.join(found)}, which returns outputs cached in earlier steps. With "
            "method='tome' those outputs were computed on that step's merged tokens and cannot be restored with this "
            "step's merge; use method='todo' or 'auto' together with it, or apply tokenmerge only to modules it does not cache"
        )


class _SpanHook:
    def __init__(self, patch: PatchState, block: int, span: int) -> None:
        self.patch = patch
        self.block = block
        self.span = span
        self.warnings = BlockWarnings(block)

    def block_call(self) -> BlockCall | None:
        call = self.patch.current()
        return None if call is None else call.blocks.get(self.block)


def _merge(plan: MergePlan, x: torch.Tensor, text: int) -> torch.Tensor:
    return plan.merge(x) if not text else torch.cat([x[:, :text], plan.merge(x[:, text:])], dim=1)


def _unmerge(plan: MergePlan, y: torch.Tensor, text: int) -> torch.Tensor:
    return plan.unmerge(y) if not text else torch.cat([y[:, :text], plan.unmerge(y[:, text:])], dim=1)


class EnterSpan(_SpanHook):
    """Pre-hook on a span's first module (or forward hook on its output): replace the tokens by merged ones."""

    def __init__(self, patch: PatchState, block: int, span: int, mask_kwarg: str | None) -> None:
        super().__init__(patch, block, span)
        self.mask_kwarg = mask_kwarg  # a self-attention mask over the tokens would have to be merged too

    def _plan(self, block: BlockCall | None, module: torch.nn.Module) -> MergePlan | None:
        if block is None or block.action.plan is None:
            return None
        span = self.patch.blocks[self.block].layout.spans[self.span]
        if not self.patch.current().config.merges(span.option, self.patch.layout.single_level):
            return None
        refuse_caching_wrappers(module, f"{span.name} of transformer block {self.block}")
        return block.action.plan

    def _plan_for(self, x: torch.Tensor, plan: MergePlan, block: BlockCall, text: int) -> MergePlan | None:
        """The plan matching ``x``: the whole plan, or its rows when feed-forward chunking splits the batch."""
        b, n = x.shape[0], x.shape[1] - text
        if n != plan.num_tokens:
            self.warnings.warn_once(
                f"a sub-layer sees {n} of {plan.num_tokens} tokens (feed-forward chunking along the sequence); it runs unmerged"
            )
            return None
        if b == plan.batch_size or plan.batch_size == 1:
            return plan
        start = block.chunk_cursor
        block.chunk_cursor = (start + b) % plan.batch_size
        return plan.rows(start, start + b)

    def _enter(self, x: Any, block: BlockCall, plan: MergePlan) -> torch.Tensor | None:
        span = self.patch.blocks[self.block].layout.spans[self.span]
        text = block.text_tokens if span.text_first else 0
        if not isinstance(x, torch.Tensor) or x.ndim != 3:
            return None
        plan = self._plan_for(x, plan, block, text)
        if plan is None:
            return None
        block.active[self.span] = plan
        return _merge(plan, x, text)

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]):
        block = self.block_call()
        plan = self._plan(block, module)
        if plan is None:
            return None
        if self.mask_kwarg is not None and kwargs.get(self.mask_kwarg) is not None:
            self.warnings.warn_once("an attention mask over the tokens is set; that sub-layer runs unmerged")
            return None
        merged = self._enter(first_tensor(args, kwargs), block, plan)
        return None if merged is None else replace_first(args, kwargs, merged)


class EnterSpanOnOutput(EnterSpan):
    """Forward hook on a module whose output (element ``index`` of a tuple) starts the merged span."""

    def __init__(self, patch: PatchState, block: int, span: int, index: int | None) -> None:
        super().__init__(patch, block, span, None)
        self.index = index

    def __call__(self, module: torch.nn.Module, args: tuple, output: Any):  # type: ignore[override]
        block = self.block_call()
        plan = self._plan(block, module)
        if plan is None:
            return None
        x = output if self.index is None else output[self.index]
        merged = self._enter(x, block, plan)
        if merged is None:
            return None
        return merged if self.index is None else (*output[: self.index], merged, *output[self.index + 1 :])


class LeaveSpan(_SpanHook):
    """Forward hook on a span's last module: restore the full token sequence of its output."""

    def __init__(self, patch: PatchState, block: int, span: int, index: int | None) -> None:
        super().__init__(patch, block, span)
        self.index = index

    def __call__(self, module: torch.nn.Module, args: tuple, output: Any):
        block = self.block_call()
        plan = None if block is None else block.active.pop(self.span, None)
        if plan is None:
            return None
        span = self.patch.blocks[self.block].layout.spans[self.span]
        text = block.text_tokens if span.text_first else 0
        if self.index is None or not isinstance(output, (tuple, list)):
            return _unmerge(plan, output, text)
        restored = _unmerge(plan, output[self.index], text)
        return type(output)((*output[: self.index], restored, *output[self.index + 1 :]))


class GatherRotary(_SpanHook):
    """Pre-hook on an attention whose rotary table (``image_rotary_emb``: text rows, then image rows) must
    follow a merge: the image rows are gathered at the kept positions (a merged token sits at its
    destination's position). The plan is shared by the batch, as the table is."""

    KWARG = "image_rotary_emb"

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]):
        block = self.block_call()
        plan = None if block is None else block.active.get(self.span)
        table = kwargs.get(self.KWARG)
        if plan is None or table is None:
            return None
        keep = plan.keep_idx[0]

        def gather(rows: torch.Tensor) -> torch.Tensor:
            text = rows.shape[0] - plan.num_tokens
            return torch.cat([rows[:text], rows[text:].index_select(0, keep.to(rows.device))])

        gathered = tuple(gather(t) for t in table) if isinstance(table, (tuple, list)) else gather(table)
        return args, {**kwargs, self.KWARG: gathered}
