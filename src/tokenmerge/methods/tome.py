"""``method="tome"``: Token Merging for Stable Diffusion (arXiv 2303.17604), as tomesd 0.1.3 merges.

Each sample's image tokens are matched on their own (:func:`plan_merge`): one destination per sx x sy (x st) window,
sources paired with their most similar destination, the ``int(N * ratio)`` best pairs averaged; the block's spans
(attention, MLP) run on the merged tokens and every token gets its destination's output back
(:class:`tokenmerge.algorithms.MergePlan`, the span protocol's merge). Plans may be shared by a level's blocks in one
call (``share_plan``) or reused across steps (``reuse_steps``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ..algorithms import MergePlan, Shard, TokenGrid, batch_metric, bipartite_soft_matching, grid_partition, random_offsets, timestep_keys
from ..options import Option
from .base import ROUTES, BlockAction, BlockFacts, Method, idle

if TYPE_CHECKING:
    from ..config import TokenMergeConfig


def window_of(config: TokenMergeConfig, grid: TokenGrid) -> tuple[int, ...]:
    """The destination window on ``grid``: sy x sx on the spatial axes, st frames on a video's."""
    return grid.spatial(config.sx, config.sy, config.st)


def merge_count(config: TokenMergeConfig, grid: TokenGrid) -> int:
    """How many of ``grid``'s tokens ToMe merges away: ``int(N * ratio)``, at most every source of the partition."""
    windows = math.prod([s // w for s, w in zip(grid.shape, window_of(config, grid))])
    return min(int(grid.numel * config.ratio), grid.numel - windows) if windows else 0


def plan_merge(
    x: torch.Tensor,
    grid: TokenGrid,
    config: TokenMergeConfig,
    key: int | torch.Tensor,
    timestep: torch.Tensor | None,
    shared_by_batch: bool = False,
) -> MergePlan | None:
    """Match the (B, N, C) tokens ``x`` of ``grid`` and return how to merge ``int(N*ratio)`` of them (or None).

    Each sample is matched on its own tokens (an image's result does not depend on the others of its batch).
    ``shared_by_batch``: one plan for all samples instead, matched on the mean of the samples' normalised tokens,
    with the first sample's timestep for the random partition: the fallback where a model's attention code takes
    a position table shared by the batch in a way per-sample rows cannot reach (:class:`tokenmerge.hooks.tokens.SampleRows`).
    """
    metric = batch_metric(x.detach()) if shared_by_batch else x
    if shared_by_batch and timestep is not None:
        timestep = timestep.flatten()[:1] if timestep.ndim < 2 else timestep[:1]  # (per-token timesteps: the first sample's)
    window = window_of(config, grid)
    offsets = None
    if config.use_rand:
        keys = timestep_keys(key, config.seed_key, timestep, metric.shape[0], x.device)
        offsets = random_offsets(keys, math.prod([s // w for s, w in zip(grid.shape, window)]), math.prod(window))
    src, dst = grid_partition(grid, window, offsets, x.device)
    dtype = None if config.match_dtype is None else getattr(torch, config.match_dtype)
    return bipartite_soft_matching(metric, src, dst, int(grid.numel * config.ratio), dtype)


class ToMe(Method):
    name = "tome"
    summary = "merges similar tokens"
    primary = "ratio"
    options = (
        Option(
            "ratio",
            "real",
            0.5,
            "the fraction of a block's image tokens merged away; at most 1 - 1/(sx*sy) is reached",
            low=0,
            high=1,
            open="high",
            widget_max=0.99,
            step=0.01,
            advanced=False,
        ),
        Option("sx", "int", 2, "width of the window one destination token is chosen in, in tokens", low=1, widget_max=8, advanced=False),
        Option("sy", "int", 2, "height of that window, in tokens", low=1, widget_max=8, advanced=False),
        Option("st", "int", 1, "frames of that window on a video's grid (1: every frame has its own destinations)", low=1, widget_max=8),
        Option(
            "use_rand",
            "bool",
            True,
            "choose each window's destination at random (derived from seed, the block and the timestep) instead of top-left",
            advanced=False,
        ),
        Option("merge_crossattn", "bool", False, "run cross-attention on the merged tokens", advanced=False),
        Option(
            "merge_mlp",
            "bool",
            None,
            "run the MLP on the merged tokens",
            none="the family's choice: on for transformers, off on UNets (as tomesd)",
            none_word="auto",
        ),
        Option("seed", "seed", None, "seed of the random destinations (all its bits count)", none="0", advanced=False),
        Option(
            "share_plan", "bool", False, "one matching per level and call, reused by the level's other blocks (faster, changes the result)"
        ),
        Option(
            "reuse_steps",
            "int",
            1,
            "reuse a block's matching for this many consecutive steps (1: match at every step)",
            low=1,
            widget_max=10,
        ),
        Option(
            "match_dtype",
            "dtype",
            None,
            "dtype of the similarity matmul",
            choices=("float32", "float16", "bfloat16"),
            none="the tokens' own, as tomesd",
            none_word="tokens",
        ),
    )
    also_reads = ("merge_attn",)
    routes = tuple(r for r in ROUTES if r != "comfyui-dit")  # ComfyUI's attention override sees no block; its block patches do
    gathers = True  # its spans run on gathered tokens (merged ones)
    supports_ring = False  # a ring rank attends to keys it does not hold, whose merge sizes it cannot know

    def is_identity(self, config: TokenMergeConfig) -> bool:
        return config.ratio == 0

    def act(self, config: TokenMergeConfig, facts: BlockFacts) -> BlockAction:
        merged = merge_count(config, facts.grid)
        if facts.tokens is None:  # describe(): the count, no matching
            return BlockAction(left_out=merged) if merged else idle(f"{facts.grid} grid too small")
        plan = self._plan(config, facts)
        return BlockAction(plan=plan, left_out=merged) if plan is not None else idle(f"{facts.grid} grid too small")

    @staticmethod
    def _plan(config: TokenMergeConfig, facts: BlockFacts) -> MergePlan | None:
        """The block's plan: matched now, or one ``share_plan`` / ``reuse_steps`` keeps (for the same shapes)."""
        x, grid, store = facts.tokens(), facts.grid, facts.plans
        shared = store is not None and store.shared_by_batch
        fresh = lambda: plan_merge(x, grid, config, facts.key, facts.timestep, shared)  # noqa: E731
        if store is None or not (config.share_plan or config.reuse_steps > 1):
            return fresh()
        key = ("level", facts.level) if config.share_plan else ("block", store.block)
        shape = (x.shape[0], x.shape[1], *grid.shape)
        if config.reuse_steps == 1 or store.recomputing:
            cached = store.call.get(key)
            if cached is None or cached[0] != shape:
                cached = store.call[key] = (shape, fresh())
            return cached[1]
        steps = store.steps()
        cached = steps.plans.get(key)
        if cached is None or cached[0] != shape or store.step - cached[1] >= config.reuse_steps:
            cached = steps.plans[key] = (shape, store.step, fresh())
        plan = cached[2]
        if plan is not None and torch.is_grad_enabled() and plan.keep_idx.is_inference():
            # Planned under torch.inference_mode(), reused with gradients: inference tensors cannot be saved.
            plan = MergePlan(*(t.clone() for t in (plan.keep_idx, plan.src_idx, plan.dst_slot, plan.counts, plan.unmerge_idx)))
            steps.plans[key] = (shape, cached[1], plan)
        return plan

    def on_shard(self, config: TokenMergeConfig, shard: Shard) -> str | None:
        if shard.box is None:
            part = f"rank {shard.rank}'s {shard.length} tokens of the {shard.whole} grid"
            return f"{part} are not a band of whole rows or frames, where ToMe's windows need one (todo and auto work on any split)"
        return None

    def void(self, config: TokenMergeConfig, grid: TokenGrid, action: BlockAction) -> tuple[str, str] | None:
        if action.idle and merge_count(config, grid) == 0:
            return (
                "no window",
                f"its {grid} token grid holds no whole sy x sx = {config.sy}x{config.sx} destination window: nothing is "
                "merged (effective ratio 0); use smaller sx / sy",
            )
        return None

    def describe(self, config: TokenMergeConfig, action: BlockAction | None, grid: TokenGrid | None, spans: tuple[str, ...]) -> str:
        if action is None:
            return f"merge tokens ({', '.join(spans)})"
        if action.left_out:
            return f"merge {action.left_out} of {grid.numel} tokens ({grid}) in {', '.join(spans)}"
        return f"unchanged ({action.reason})"

    def warnings_at_patch(self, config: TokenMergeConfig) -> list[str]:
        if config.ratio > config.max_ratio:
            return [
                f"tokenmerge: ratio={config.ratio} exceeds the reachable maximum 1 - 1/(sx*sy) = {config.max_ratio:g} "
                f"for sx={config.sx}, sy={config.sy}; the effective ratio is {config.max_ratio:g}"
            ]
        return []

    def frame_option(self, config: TokenMergeConfig) -> tuple[str, str] | None:
        return (f"st={config.st}", "st=1") if config.st > 1 else None
