"""Attach one patch's hooks to a denoiser from its family's layout of it, and take them off again."""

from __future__ import annotations

from typing import Any

import torch

from ..config import TokenMergeConfig
from ..families import DenoiserLayout
from ..families.base import Argument
from ..planning import block_key
from . import dispatch
from .attention import CloseKeyValueMode, DownsampleKeysValues, DownsampleProjectionInput
from .calls import BeginCall, CaptureLayout, EndBlock, EndCall, LeaveContainer, PlanBlock, RecomputeEntry
from .state import BlockInfo, PatchState
from .tokens import CloseSampleRows, EnterSpan, EnterSpanOnOutput, FollowSpan, GatherBlock, LeaveSpan, RestoreBlock

STATE_ATTR = "_tokenmerge_state"


def install(layout: DenoiserLayout, config: TokenMergeConfig) -> PatchState:
    patch = PatchState(config, layout)

    def add(handle: Any) -> None:
        patch.handles.append(handle)
        hooks = handle.hooks_dict_ref()
        if hooks is not None and handle.id in hooks:
            patch.hooks[handle.id] = hooks[handle.id]

    root = layout.root
    add(root.register_forward_pre_hook(BeginCall(patch), with_kwargs=True))
    for c, container in enumerate(layout.containers):
        add(container.module.register_forward_pre_hook(CaptureLayout(patch, c), with_kwargs=True))
        add(container.module.register_forward_hook(LeaveContainer(patch), with_kwargs=True, always_call=True))
        for block in container.blocks:
            index = len(patch.blocks)
            patch.blocks.append(
                BlockInfo(
                    index,
                    container.level,
                    torch.tensor([block_key(index)]),
                    c,
                    Argument(block.module, block.input_name),
                    block,
                    tuple(Argument(block.module, name) for name in block.output.per_token) if block.output is not None else (),
                )
            )
            add(block.module.register_forward_pre_hook(PlanBlock(patch, patch.blocks[index]), with_kwargs=True))
            if block.output is not None:  # (after PlanBlock; RestoreBlock before EndBlock ends the block's call)
                add(block.module.register_forward_pre_hook(GatherBlock(patch, index), with_kwargs=True))
                add(block.module.register_forward_hook(RestoreBlock(patch, index), with_kwargs=True))
            add(block.module.register_forward_hook(EndBlock(patch, index), with_kwargs=True, always_call=True))
            if block.recompute_method is not None:
                setattr(block.module, block.recompute_method, RecomputeEntry(patch, index, block.module, block.recompute_method))
                patch.wrapped.append((block.module, block.recompute_method))
            for s, span in enumerate(block.spans):
                if span.enter_on_output:
                    add(span.enter.register_forward_hook(EnterSpanOnOutput(patch, index, s, span.enter_index)))
                else:
                    mask = next((site.mask_kwarg for site in block.kv_sites if site.module is span.enter), None)
                    add(span.enter.register_forward_pre_hook(EnterSpan(patch, index, s, mask), with_kwargs=True))
                for attention, follow in span.follows:
                    hook = FollowSpan(patch, index, s, follow, Argument(attention, follow.argument))
                    add(attention.register_forward_pre_hook(hook, with_kwargs=True))
                add(span.leave.register_forward_hook(LeaveSpan(patch, index, s, span.leave_index)))
            for attention in {id(m): m for span in block.spans for m, _ in span.follows}.values():
                add(attention.register_forward_hook(CloseSampleRows(patch, index), with_kwargs=True))
            for k, site in enumerate(block.kv_sites):
                add(site.module.register_forward_pre_hook(DownsampleKeysValues(patch, index, k), with_kwargs=True))
                add(site.module.register_forward_hook(CloseKeyValueMode(patch, index), with_kwargs=True))
                for projection in site.projections:
                    add(projection.register_forward_pre_hook(DownsampleProjectionInput(patch, site.module)))
    # After the containers' hooks: a root that is a container leaves it before its call closes.
    add(root.register_forward_hook(EndCall(patch), with_kwargs=True, always_call=True))
    if any(block.kv_sites for block in layout.blocks):
        dispatch.acquire()
        patch.routes_dispatch = True
    setattr(root, STATE_ATTR, patch)
    patch.bind_hooks()
    return patch


def uninstall(root: torch.nn.Module, patch: PatchState) -> None:
    for handle in patch.handles:
        handle.remove()
    for module, attribute in patch.wrapped:
        if attribute in vars(module):
            delattr(module, attribute)
    if getattr(patch, "routes_dispatch", False):
        patch.routes_dispatch = False
        dispatch.release()
    delattr(root, STATE_ATTR)


def states_in(roots: list[torch.nn.Module]) -> list[tuple[torch.nn.Module, PatchState]]:
    """Every patched denoiser under ``roots`` with its state."""
    return states_of([m for root in roots for m in root.modules()])


def states_of(modules: list[torch.nn.Module]) -> list[tuple[torch.nn.Module, PatchState]]:
    """The patched denoisers among ``modules`` with their states."""
    return [(m, s) for m in modules if isinstance(s := vars(m).get(STATE_ATTR), PatchState)]
