"""What the key/value methods (``todo``, ``auto``) share: they downsample the image keys and values of a block's self-
or joint attentions by a factor per grid axis; queries, text and reference tokens keep every token. Where and how
the keys are reduced is :func:`tokenmerge.algorithms.downsample.reduce_keys_values` (one reduction for every route)."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from ..algorithms import Shard, TokenGrid
from .base import BlockAction, BlockFacts, Method, idle

if TYPE_CHECKING:
    from ..config import TokenMergeConfig


class KeyValueMethod(Method):
    """A method whose action is a key/value factor per axis of the block's grid (chosen on the whole grid under
    context parallelism, so that every rank and one process choose the same)."""

    reduces_keys = True

    def factors(self, config: TokenMergeConfig, grid: TokenGrid) -> tuple[int, ...]:
        """The key/value factor per axis of a block on ``grid`` (all 1: leave it alone)."""
        raise NotImplementedError

    def unchanged(self, config: TokenMergeConfig, grid: TokenGrid) -> str:
        """Why a block of ``grid`` is left alone by factors of 1."""
        return "factor 1"

    def act(self, config: TokenMergeConfig, facts: BlockFacts) -> BlockAction:
        whole = facts.whole or facts.grid
        factors = self.factors(config, whole)
        if max(factors) == 1:
            return idle(self.unchanged(config, whole))
        action = BlockAction(kv_grid=facts.grid, kv_factors=factors)
        shard = facts.shard
        if shard is not None and config.kv_interpolation.startswith("nearest"):
            keep, counts = shard.kept(factors, config.kv_interpolation, facts.device)
            if len(set(counts)) > 1 and not facts.uneven:
                facts.notes.append(
                    (
                        "parallel",
                        f"under context parallelism, the {shard.world} ranks' parts of its {shard.whole} grid hold "
                        f"{', '.join(map(str, counts))} of the keys one process keeps (factor {action.kv_label}); each keeps "
                        f"{max(counts)} (the collectives need equal lengths), a few more than one process would",
                    )
                )
            action = dataclasses.replace(action, kv_keep=keep)
        return action

    def on_shard(self, config: TokenMergeConfig, shard: Shard) -> str | None:
        if config.kv_interpolation.startswith("nearest"):
            return None
        factors = self.factors(config, shard.whole)
        if shard.box is None or not _aligned(shard, factors):
            part = f"rank {shard.rank}'s {shard.length} tokens of the {shard.whole} grid"
            return (
                f"{part} do not start and end on whole windows of factor {'x'.join(map(str, factors))}, where "
                f"kv_interpolation={config.kv_interpolation!r} would mix keys across ranks; use 'nearest-exact'"
            )
        return None

    def void(self, config: TokenMergeConfig, grid: TokenGrid, action: BlockAction) -> tuple[str, str] | None:
        if action.kv_grid is not None and any(f > s for f, s in zip(action.kv_factors, grid.shape)):
            kept = grid.reduced(action.kv_factors)
            return (
                "factor beyond grid",
                f"key/value factor {action.kv_label} exceeds a side of its {grid} token grid: its {grid.numel} keys "
                f"become {kept.numel} ({kept})",
            )
        return None

    def describe(self, config: TokenMergeConfig, action: BlockAction | None, grid: TokenGrid | None, spans: tuple[str, ...]) -> str:
        if action is None:
            return f"downsample keys/values ({self.name})"
        if action.kv_grid is None:
            return f"unchanged ({action.reason})" if action.reason != "factor 1" else "unchanged"
        kept = grid.reduced(action.kv_factors)
        return f"keys/values {grid.numel} -> {kept.numel} (factor {action.kv_label}, {grid} -> {kept})"


def _aligned(shard: Shard, factors: tuple[int, ...]) -> bool:
    """Whether a box shard starts and ends on window boundaries of ``factors`` along the axis it is cut on."""
    whole, box = shard.whole.shape, shard.box.shape
    cut = [a for a, (w, b) in enumerate(zip(whole, box)) if w != b]  # (1, m, W) of (F, H, W): inside one frame
    if not cut:
        return True
    axis = cut[-1]
    if any(factors[a] > 1 for a in cut[:-1]):  # a window across the axes before the cut spans ranks
        return False
    first = (shard.start // math.prod(whole[axis + 1 :])) % whole[axis]
    last = first + box[axis]
    return first % factors[axis] == 0 and (last % factors[axis] == 0 or last == whole[axis])
