"""Hook objects that apply a merge plan around a transformer block's sub-layers.

The upstream block forward runs unchanged. Hooks (plain PyTorch forward hooks, so they survive
``copy.deepcopy``, ``torch.save`` of the whole module and ``torch.compile``) do three things:

- on the denoiser: remember the timestep (the random partition depends on it) and count calls/steps
  (for matchings reused across blocks or steps);
- on each spatial transformer (``Transformer2DModel``, ``SpatialTransformer``, ...): remember the
  (H, W) of its (B, C, H, W) input, the exact token grid of its blocks;
- on each block: compute the merge plan from the block's input; on ``attn1`` / ``attn2`` / ``ff``:
  merge the sub-layer's input and unmerge its output, so the residual stream keeps every token.

The states below are plain objects shared by the hooks of one denoiser; nothing is stored on the
modules except the hooks themselves and one ``_tokenmerge_state`` attribute on the denoiser.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from .config import TokenMergeConfig
from .matching import MergePlan, downsample_tokens
from .planning import kv_factor_for, plan_merge

STATE_ATTR = "_tokenmerge_state"


def first_tensor_arg(args: tuple, kwargs: dict[str, Any], names: tuple[str, ...]) -> torch.Tensor | None:
    """The module's main input: the first positional argument, or the first of ``names`` passed by keyword."""
    if args:
        return args[0]
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return None


_INPUT_NAMES = ("hidden_states", "x")


@dataclass
class CachedPlan:
    """A matching kept for reuse (``share_plan`` / ``reuse_steps``), with what it is valid for."""

    plan: MergePlan | None
    shape: tuple[int, int, int, int]  # (batch, tokens, h, w) it was computed for
    step: int


@dataclass
class DenoiserState:
    """Options and per-call facts of one patched denoiser (a UNet or ControlNet)."""

    config: TokenMergeConfig
    top_level: int  # downsampling factor of the highest-resolution level that has attention
    timestep_arg: tuple[str, int] | None  # name and positional index of the denoiser's timestep
    blocks: list[BlockState] = field(default_factory=list)
    handles: list[RemovableHandle] = field(default_factory=list)
    timestep: torch.Tensor | None = None
    step: int = -1  # counts calls, or denoising steps (timestep changes) when reuse_steps > 1
    last_timestep: list[float] | None = None
    plans: dict[tuple[str, int], CachedPlan] = field(default_factory=dict)

    @property
    def merge_level(self) -> int:
        return self.config.merge_level(self.top_level)

    def merged_blocks(self) -> list[BlockState]:
        return [b for b in self.blocks if b.level <= self.merge_level]

    def reset(self) -> None:
        """Forget cached matchings and the step count (new options, or a new patch)."""
        self.step, self.last_timestep, self.plans = -1, None, {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "timestep": None, "step": -1, "last_timestep": None, "plans": {}}


@dataclass
class GridState:
    """The token grid (H, W) seen by one spatial transformer in the current call."""

    size: tuple[int, int] | None = None


@dataclass
class BlockState:
    """The merge plan of one transformer block, shared by the hooks of its sub-layers."""

    denoiser: DenoiserState
    grid: GridState
    level: int
    key: int  # hash of the block's index, for the random partition
    index: int
    plan: MergePlan | None = None
    todo_grid: tuple[int, int] | None = None  # set when method="todo"/"auto" downsamples this call's keys/values
    kv_factor: int = 1
    chunk_cursor: int = 0
    warned: bool = False

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "plan": None, "todo_grid": None}

    def warn_once(self, message: str) -> None:
        if not self.warned:
            self.warned = True
            warnings.warn(f"tokenmerge: transformer block {self.index}: {message}", stacklevel=3)


class BeginCall:
    """Forward pre-hook on the denoiser: keep its timestep (for the random partition) and count steps."""

    def __init__(self, state: DenoiserState) -> None:
        self.state = state

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        state = self.state
        t = None
        if state.timestep_arg is not None:
            name, index = state.timestep_arg
            t = kwargs.get(name, args[index] if len(args) > index else None)
            if t is not None and not isinstance(t, torch.Tensor):
                t = torch.tensor(t)
        state.timestep = t
        if state.config.reuse_steps == 1:
            state.step += 1
            return
        # A new denoising step is a new timestep value (reading it syncs with the device, so only here).
        value = None if t is None else t.flatten().tolist()
        if value is None or value != state.last_timestep:
            state.step += 1
            state.last_timestep = value


class CaptureGrid:
    """Forward pre-hook on a spatial transformer: its (B, C, H, W) input gives its blocks' token grid."""

    def __init__(self, grid: GridState) -> None:
        self.grid = grid

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        x = first_tensor_arg(args, kwargs, _INPUT_NAMES)
        self.grid.size = (x.shape[-2], x.shape[-1]) if x is not None and x.ndim == 4 else None


class PlanMerge:
    """Forward pre-hook on a transformer block: build its merge plan from the block input."""

    def __init__(self, block: BlockState) -> None:
        self.block = block

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        block = self.block
        block.plan = None
        block.todo_grid = None
        block.chunk_cursor = 0
        config = block.denoiser.config
        if block.level > block.denoiser.merge_level or config.is_identity:
            return
        x = first_tensor_arg(args, kwargs, _INPUT_NAMES)
        size = block.grid.size
        if x is None or x.ndim != 3 or size is None:
            block.warn_once("could not read its (batch, tokens, channels) input; this block is not merged")
            return
        b, n, _ = x.shape
        h, w = size
        if n != h * w:
            block.warn_once(f"got {n} tokens for a {h}x{w} grid; this block is not merged")
            return
        if config.method in ("todo", "auto"):
            block.kv_factor = kv_factor_for(config, n)
            block.todo_grid = (h, w) if block.kv_factor > 1 else None
        elif config.share_plan or config.reuse_steps > 1:
            block.plan = self._reused_plan(x, h, w)
        else:
            block.plan = plan_merge(x, h, w, config, block.key, block.denoiser.timestep)

    def _reused_plan(self, x: torch.Tensor, h: int, w: int) -> MergePlan | None:
        """The level's (share_plan) or block's cached matching while valid, else a new one."""
        block = self.block
        state = block.denoiser
        config = state.config
        key = ("level", block.level) if config.share_plan else ("block", block.index)
        shape = (x.shape[0], x.shape[1], h, w)
        cached = state.plans.get(key)
        if cached is None or cached.shape != shape or state.step - cached.step >= config.reuse_steps:
            cached = CachedPlan(plan_merge(x, h, w, config, block.key, state.timestep), shape, state.step)
            state.plans[key] = cached
        return cached.plan


@dataclass
class SubLayerState:
    """The plan a sub-layer's input was merged with, so its output is unmerged with the same one."""

    in_use: MergePlan | None = None


class MergeInput:
    """Forward pre-hook on attn1 / attn2 / ff: replace the input tokens by the merged ones."""

    def __init__(self, block: BlockState, sublayer: SubLayerState, option: str, mask_kwarg: str | None) -> None:
        self.block = block
        self.sublayer = sublayer
        self.option = option  # merge_attn, merge_crossattn or merge_mlp
        self.mask_kwarg = mask_kwarg  # a self-attention mask would have to be merged too

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]):
        self.sublayer.in_use = None
        plan = self.block.plan
        if plan is None or not getattr(self.block.denoiser.config, self.option):
            return None
        if self.mask_kwarg is not None and kwargs.get(self.mask_kwarg) is not None:
            self.block.warn_once(f"{self.option}: an attention mask over the tokens is set; not merged")
            return None
        x = first_tensor_arg(args, kwargs, _INPUT_NAMES)
        plan = self._plan_for(x, plan)
        if plan is None:
            return None
        self.sublayer.in_use = plan
        merged = plan.merge(x)
        if args:
            return (merged, *args[1:]), kwargs
        key = next(name for name in _INPUT_NAMES if name in kwargs)
        return args, {**kwargs, key: merged}

    def _plan_for(self, x: torch.Tensor, plan: MergePlan) -> MergePlan | None:
        """The plan matching ``x``: the whole plan, or its rows when feed-forward chunking splits the batch."""
        b, n = x.shape[0], x.shape[1]
        if n != plan.num_tokens:
            self.block.warn_once(
                f"{self.option}: the sub-layer sees {n} of {plan.num_tokens} tokens (feed-forward chunking "
                "along the sequence); it runs unmerged"
            )
            return None
        if b == plan.batch_size:
            return plan
        start = self.block.chunk_cursor
        self.block.chunk_cursor = (start + b) % plan.batch_size
        return plan.rows(start, start + b)


class DownsampleKeysValues:
    """Forward pre-hook on attn1 for method="todo": keys and values from a downsampled copy of the tokens.

    Passing the copy as the attention's cross-attention input (``encoder_hidden_states`` in diffusers,
    ``context`` in ldm/sgm) makes the unchanged attention compute K and V from it; queries stay full."""

    def __init__(self, block: BlockState, kv_kwarg: str) -> None:
        self.block = block
        self.kv_kwarg = kv_kwarg

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]):
        grid = self.block.todo_grid
        if grid is None or kwargs.get(self.kv_kwarg) is not None:  # attn1 already attends to a context
            return None
        config = self.block.denoiser.config
        x = first_tensor_arg(args, kwargs, _INPUT_NAMES)
        kv = downsample_tokens(x, grid[0], grid[1], self.block.kv_factor, config.kv_interpolation)
        return args, {**kwargs, self.kv_kwarg: kv}


class UnmergeOutput:
    """Forward hook on attn1 / attn2 / ff: restore the full token sequence of the output."""

    def __init__(self, sublayer: SubLayerState) -> None:
        self.sublayer = sublayer

    def __call__(self, module: torch.nn.Module, args: tuple, output: Any):
        plan = self.sublayer.in_use
        if plan is None:
            return None
        self.sublayer.in_use = None
        return plan.unmerge(output)
