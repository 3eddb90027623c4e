"""The span protocol's hooks: a block's image tokens gathered on entering a span and scattered back on leaving it
(:class:`tokenmerge.algorithms.TokenSpan`; ToMe's merge and unmerge), with the position tables that follow them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..algorithms import AROUND_BLOCK, TokenLayout, TokenSpan, restore_residual, take_rows
from .calls import PlanBlock, first_tensor, replace_first
from .modes import call_through
from .state import BlockCall, BlockWarnings, PatchState
from .step_caches import caching_wrappers


def cached_span_notice(modules: list[torch.nn.Module], where: Callable[[], str]) -> str | None:
    """Why a merged span must run unmerged: a diffusers hook in it may return an output cached in an earlier step,
    computed on that step's merged tokens, which this step's merge cannot restore. Unmerged, every output the hook
    caches or replays has the full sequence, so the two compose exactly (only that span's saving is given up).
    (``where`` is said only when one is found: a compiled graph is specialised on every value it reads.)"""
    found = sorted({name for module in modules for name in caching_wrappers(module)})
    if not found:
        return None
    where = where()
    return (
        f"{where} is wrapped by diffusers' {', '.join(found)} hook, which returns outputs cached in earlier steps; merged "
        "outputs of one step cannot be restored with another step's merge, so that span runs unmerged (method='todo' or "
        "'auto' keep every token and compose with such caches fully)"
    )


class _SpanHook:
    def __init__(self, patch: PatchState, block: int, span: int) -> None:
        self.patch = patch
        self.block = block
        self.span = span
        self.warnings = BlockWarnings(patch, block)

    def block_call(self) -> BlockCall | None:
        call = self.patch.current()
        return None if call is None else call.running

    def span_of(self, block: BlockCall) -> Any:
        return block.info.layout.spans[self.span]


def _gather(span: TokenSpan, x: torch.Tensor, layout: TokenLayout, index: int) -> torch.Tensor:
    """The span's tokens of ``x`` (laid out as ``layout``): its target image segment gathered, every other token in
    place; ``index``: which span of the block."""
    start, n = layout.image_start, span.num_tokens
    if start == 0 and n == x.shape[1]:
        return span.gather(x, index)
    return torch.cat([x[:, :start], span.gather(x[:, start : start + n], index), x[:, start + n :]], dim=1)


def _scatter(span: TokenSpan, y: torch.Tensor, layout: TokenLayout, index: int) -> torch.Tensor:
    """Every token's output of a span's output ``y``: its image segment scattered back, the rest in place."""
    start, kept = layout.image_start, span.num_kept
    if start == 0 and kept == y.shape[1]:
        return span.scatter(y, index)
    return torch.cat([y[:, :start], span.scatter(y[:, start : start + kept], index), y[:, start + kept :]], dim=1)


class EnterSpan(_SpanHook):
    """Pre-hook on a span's first module (or forward hook on its output): replace the tokens by merged ones."""

    def __init__(self, patch: PatchState, block: int, span: int, mask_kwarg: str | None) -> None:
        super().__init__(patch, block, span)
        self.mask_kwarg = mask_kwarg  # a self-attention mask over the tokens would have to be merged too

    def _plan(self, block: BlockCall | None, module: torch.nn.Module) -> TokenSpan | None:
        if block is None or block.action.plan is None or block.action.around_block:  # (gathered at the block's entry)
            return None
        span = self.span_of(block)
        config = self.patch.current().config
        if not config.method_of.every_span and not config.merges(span.option, self.patch.layout.single_level):
            return None
        modules = [span.enter, span.leave, *[m for m, _ in span.follows]]
        notice = cached_span_notice(modules, lambda: f"the {span.name} of block {self.block}")
        if notice is not None:
            self.patch.notice("step cache", notice)
            return None
        return block.action.plan

    def _plan_for(self, x: torch.Tensor, plan: TokenSpan, block: BlockCall, stream: TokenLayout) -> TokenSpan | None:
        """The plan matching ``x``: the whole plan, or its rows when feed-forward chunking splits the batch."""
        b = x.shape[0]
        if x.shape[1] != stream.total:
            self.warnings.warn_once(
                "chunked sub-layer",
                f"a sub-layer sees {x.shape[1]} of the {stream.total} tokens of its stream ({stream}; feed-forward chunking "
                "along the sequence?); it runs unmerged",
            )
            return None
        if b == plan.batch_size or plan.batch_size == 1:
            return plan
        start = block.chunk_cursor
        block.chunk_cursor = (start + b) % plan.batch_size
        part = plan.rows(start, start + b)
        if part is None:
            self.warnings.warn_once(
                "batch chunks",
                "a sub-layer runs on chunks of the batch (feed-forward chunking), which this span cannot follow; it runs whole",
            )
        return part

    def _enter(self, x: Any, block: BlockCall, plan: TokenSpan) -> torch.Tensor | None:
        span = self.span_of(block)
        if not isinstance(x, torch.Tensor) or x.ndim != 3 or block.layout is None:
            return None
        stream = block.layout.stream(span.stream)
        plan = self._plan_for(x, plan, block, stream)
        if plan is None:
            return None
        block.active[self.span] = (plan, stream)
        if plan.fills_keys:  # its attention may take every token's keys from the full input
            block.inputs[self.span] = x
        return _gather(plan, x, stream, self.span)

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]):
        block = self.block_call()
        plan = self._plan(block, module)
        if plan is None:
            return None
        if self.mask_kwarg is not None and kwargs.get(self.mask_kwarg) is not None:
            self.warnings.warn_once("mask", "an attention mask over the tokens is set; that sub-layer runs unmerged")
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
        active = None if block is None else block.active.pop(self.span, None)
        if active is None:
            return None
        plan, stream = active
        block.inputs.pop(self.span, None)
        if self.index is None or not isinstance(output, (tuple, list)):
            return _scatter(plan, output, stream, self.span)
        restored = _scatter(plan, output[self.index], stream, self.span)
        return type(output)((*output[: self.index], restored, *output[self.index + 1 :]))


class GatherBlock(_SpanHook):
    """Pre-hook on a block whose action is ``around_block`` (after its :class:`~tokenmerge.hooks.calls.PlanBlock`):
    the block runs on its input stream with the image tokens the plan keeps; :class:`RestoreBlock` restores them.
    A block whose input a context-parallel plan splits inside its forward (handed the whole sequence) is handed its
    rank's gathered tokens once per rank, so that the split gives each rank them (the others' chunks are not read)."""

    def __init__(self, patch: PatchState, block: int) -> None:
        super().__init__(patch, block, AROUND_BLOCK)

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]):
        block = self.block_call()
        if block is None or not block.action.around_block or block.layout is None:
            return None
        x = block.info.input(args, kwargs)
        stream = block.layout.stream(block.info.layout.input_stream)
        split = self.patch.current().split
        whole = split is not None and x.shape[1] != stream.total
        if whole:
            x = split.chunk(x)
        plan, start = block.action.plan, stream.image_start
        gathered = _gather(plan, x, stream, AROUND_BLOCK)
        block.around = (x, gathered[:, start : start + plan.num_kept], stream)
        return PlanBlock.replace_input(args, kwargs, block.info, gathered.repeat(1, split.world, 1) if whole else gathered)


class RestoreBlock(_SpanHook):
    """Forward hook on a block that :class:`GatherBlock` ran on gathered tokens: every token's output, each other image
    token its input plus the residual the plan gives it (on a step that keeps every token, its residual recorded and
    the output as it is)."""

    def __init__(self, patch: PatchState, block: int) -> None:
        super().__init__(patch, block, AROUND_BLOCK)

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any], output: Any):
        block = self.block_call()
        if block is None or block.around is None:
            return None
        (x, gathered, stream), block.around = block.around, None
        plan, start, index = block.action.plan, stream.image_start, block.info.layout.output.index
        y = output if index is None else output[index]
        if plan.whole:
            plan.scatter(y[:, start : start + plan.num_tokens] - gathered, AROUND_BLOCK)
            return None
        restored = restore_residual(plan, start, x, gathered, y, AROUND_BLOCK)
        return restored if index is None else type(output)((*output[:index], restored, *output[index + 1 :]))


class SampleRows(TorchFunctionMode):
    """Per-sample rows of the position tables a model shares by the batch, for one attention call whose samples were
    each merged by their own plan.

    A rotary table without a batch dimension (Flux's ``(cos, sin)``, each (S, D); Qwen-Image's complex (S, D/2)) can
    hold one row order only, where every sample keeps other positions. The attention is handed a placeholder of the
    shape it expects (the first sample's rows); while it runs, where its code broadcasts that placeholder against the
    batch, by indexing with a leading ``None`` (diffusers' ``apply_rotary_emb``: ``cos[None, :, None, :]``) or by
    ``unsqueeze`` (Qwen-Image's ``freqs_cis.unsqueeze(1)``), the rows of every sample take its place: one batched
    attention, each sample at its own positions. A placeholder that its attention never broadcasts that way is
    reported by :meth:`unused` (the patch then shares its plans by the batch, said once)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[int, tuple[torch.Tensor, torch.Tensor, list[int]]] = {}  # id(placeholder) -> it, rows, uses

    def add(self, rows: torch.Tensor) -> torch.Tensor:
        """The placeholder of ``rows`` (B, S', ...), the per-sample rows of a (S', ...) table."""
        placeholder = rows[0]
        self.tables[id(placeholder)] = (placeholder, rows, [0])
        return placeholder

    def unused(self) -> bool:
        """Whether a placeholder reached the attention without being broadcast against the batch (its first sample's
        rows then stood for every sample's)."""
        return any(uses[0] == 0 for _, _, uses in self.tables.values())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        found = self.tables.get(id(args[0])) if args and isinstance(args[0], torch.Tensor) else None
        if found is None or found[0] is not args[0]:
            return call_through(func, args, kwargs)
        _, rows, uses = found
        if func is torch.Tensor.__getitem__:
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            if index and index[0] is None:
                uses[0] += 1
                return rows[(slice(None), *index[1:])]
        elif func in (torch.Tensor.unsqueeze, torch.unsqueeze):
            dim = args[1] if len(args) > 1 else kwargs["dim"]
            if dim >= 0:
                uses[0] += 1
                return rows.unsqueeze(dim + 1)
        elif func is torch.Tensor.to:
            moved = func(*args, **kwargs)
            return moved if moved is args[0] else self.add(rows.to(*args[1:], **kwargs))
        return call_through(func, args, kwargs)


class FollowSpan(_SpanHook):
    """Pre-hook on an attention inside a merged span: the arguments declared to follow the merge (rotary tables,
    masks over the sequence; :class:`tokenmerge.families.base.Follow`) are gathered at the kept positions of their
    stream, per sample (a merged token sits at its destination's position; other segments keep every row). A table
    with a batch dimension (of the batch's size or of 1) gets each sample's rows; one without (rows along dim 0)
    gets them through :class:`SampleRows`."""

    def __init__(self, patch: PatchState, block: int, span: int, follow: Any, argument: Any) -> None:
        super().__init__(patch, block, span)
        self.follow = follow  # families.base.Follow
        self.argument = argument  # families.base.Argument of the attention's forward

    def _gather(self, t: Any, plan: TokenSpan, layout: TokenLayout, module: torch.nn.Module) -> Any:
        if isinstance(t, (tuple, list)):  # a nested table (Allegro's (t, h, w) position rows)
            return type(t)(self._gather(u, plan, layout, module) for u in t)
        if not isinstance(t, torch.Tensor):
            return t
        dim = self.follow.dim % t.ndim
        if t.shape[dim] != layout.total:
            self.warnings.warn_once(
                "follow rows", f"{self.follow.argument} has {t.shape[dim]} rows along dim {self.follow.dim}, not {layout.total}"
            )
            return t
        if plan.batch_size == 1:
            return t.index_select(dim, layout.kept_rows(plan.keep_idx[0].to(t.device)))
        rows = layout.kept_rows(plan.keep_idx.to(t.device))  # (B, S')
        if dim == 0:  # no batch dimension: each sample's rows through the attention's SampleRows mode
            return self._sample_rows(module).add(t[rows])
        return take_rows(t, dim, rows)

    def _sample_rows(self, module: torch.nn.Module) -> SampleRows:
        """The attention call's :class:`SampleRows` (entered here; :class:`CloseSampleRows` leaves it)."""
        mode = self.patch.open_mode_of(module, SampleRows)
        if mode is None:
            mode = SampleRows()
            mode.__enter__()
            self.patch.open_mode(module, mode)
        return mode

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]):
        block = self.block_call()
        active = None if block is None else block.active.get(self.span)
        if block is not None and block.around is not None:  # the whole block runs on the gathered tokens
            active = (block.action.plan, None)
        value = self.argument(args, kwargs)
        if active is None or value is None:
            return None
        plan, _ = active
        if plan.whole:  # the span keeps every token: nothing to gather
            return None
        layout = block.layout.stream(self.follow.stream)
        element = self.follow.element
        if isinstance(value, (tuple, list)):
            gathered = type(value)(
                self._gather(t, plan, layout, module) if element is None or i == element else t for i, t in enumerate(value)
            )
        else:
            gathered = self._gather(value, plan, layout, module)
        return self.argument.replace(args, kwargs, gathered)


class CloseSampleRows:
    """Forward hook on an attention with tables that follow a merge: leave the :class:`SampleRows` its call entered.
    A table the attention did not broadcast as that mode expects gave every sample the first one's positions: said
    once, and from the next call on the patch shares its plans by the batch (positions right, images coupled)."""

    def __init__(self, patch: PatchState, block: int) -> None:
        self.patch = patch
        self.block = block

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        mode = self.patch.close_mode(module, SampleRows)
        if mode is None:
            return
        mode.__exit__(None, None, None)
        if mode.unused() and not self.patch.shared_plans:
            self.patch.shared_plans = True
            self.patch.notice(
                "sample rows",
                f"the attention {type(module).__name__} of block {self.block} used its position table in a way tokenmerge "
                "cannot give each sample of a batch its own rows: in this call the images after the first had the first "
                "one's positions in merged spans. From now on one matching serves the whole batch (the images of a batch "
                "then depend on each other); use batch 1, or method='todo' / 'auto'",
            )
