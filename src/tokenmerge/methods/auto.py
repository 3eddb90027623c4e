"""``method="auto"``: token downsampling whose factor each block chooses from its token count (:func:`auto_kv_factors`),
in the low-noise steps only by default (``max_noise`` 0.4, chosen on the reference models' frontier: it keeps ToMe
r=0.5's quality on every yardstick, docs/quality.md). Grids of at most ``auto_min_tokens`` are left alone."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..algorithms import TokenGrid
from ..options import Option
from .keys import KeyValueMethod

if TYPE_CHECKING:
    from ..config import TokenMergeConfig

# auto's max_noise when none is given: chosen on the reference models' frontier (seeds 0-7, checked on 100-107),
# the highest level at which auto keeps ToMe r=0.5's quality on every yardstick (docs/quality.md).
AUTO_MAX_NOISE = 0.4
# On a few-step schedule (at most tokenmerge.steps.FEW_STEPS steps: distilled models, whose noise stays high to the
# end) auto's default reduces this share of the last steps instead: chosen on the 4-step distilled reference's
# frontier (docs/few_steps.md).
AUTO_FEW_STEP_SHARE = 0.5


def auto_kv_factor(tokens: int, max_keys: int, min_tokens: int, max_factor: int | None = None) -> int:
    """The key/value downsampling factor of a block with ``tokens`` image tokens.

    Grids of at most ``min_tokens`` tokens are left alone (factor 1): there attention is cheap next to the block's
    projections and MLP, and downsampling does not pay. Larger grids get the smallest integer factor f >= 2 with
    tokens / f**2 <= max_keys, so attention cost stays about linear in the token count. Integer (not power-of-two)
    factors keep the key count near the budget at every resolution; ``max_factor`` caps them (quality at large sizes).
    """
    if tokens <= min_tokens:
        return 1
    factor = max(2, math.ceil(math.sqrt(tokens / max_keys)))
    return factor if max_factor is None else min(factor, max_factor)


def auto_kv_factors(grid: TokenGrid, max_keys: int, min_tokens: int, max_factor: int | None = None) -> tuple[int, ...]:
    """The key/value factor per axis of ``grid``.

    An image (or a one-frame video) gets :func:`auto_kv_factor` on both sides. A video of more than ``min_tokens``
    tokens keeps every second frame's keys (latent frames are already 4 video frames apart and still alike; the
    model keeps every query) and each frame gets the image rule with ``max_keys`` per frame, so the key count grows
    with the frames, as the video's own detail does.
    """
    if grid.rank < 3 or grid.shape[0] == 1:
        f = auto_kv_factor(grid.numel, max_keys, min_tokens, max_factor)
        return grid.spatial(f, f)
    if grid.numel <= min_tokens:
        return (1,) * grid.rank
    frame = math.prod(grid.shape[-2:])
    f = auto_kv_factor(frame, max_keys, min_tokens, max_factor)
    return (1,) * (grid.rank - 3) + (2, f, f)


class Auto(KeyValueMethod):
    name = "auto"
    summary = "picks a key/value downsampling factor per block"
    options = (
        Option(
            "auto_max_keys",
            "int",
            512,
            "key budget per self-attention (per frame on a video): lower is faster and coarser",
            low=1,
            widget_max=8192,
        ),
        Option("auto_min_tokens", "int", 1024, "grids of at most this many tokens are left alone", low=1, widget_max=65536),
        Option(
            "auto_max_factor",
            "int",
            3,
            "the largest factor per side",
            low=2,
            none="no cap: the budget alone decides",
            widget_max=16,
            doc="With auto's max_noise it keeps ToMe r=0.5's quality at 2048 px strengths on the reference models, where "
            "the budget's own factors (6 on Flux, 12 on SD 1.5) lose it.",
        ),
    )
    also_reads = ("kv_interpolation",)
    default_max_noise = AUTO_MAX_NOISE
    few_step_share = AUTO_FEW_STEP_SHARE
    every_level = True  # its rule leaves small grids alone

    def factors(self, config: TokenMergeConfig, grid: TokenGrid) -> tuple[int, ...]:
        return auto_kv_factors(grid, config.auto_max_keys, config.auto_min_tokens, config.auto_max_factor)

    def unchanged(self, config: TokenMergeConfig, grid: TokenGrid) -> str:
        return f"{grid.numel} tokens: at most auto_min_tokens"

    def idle_notice(self, config: TokenMergeConfig, largest: TokenGrid) -> str | None:
        if largest.numel > config.auto_min_tokens:  # idle for another reason, said where it was found
            return None
        return (
            f"method='auto' leaves every block unchanged at this size: its largest token grid, {largest} = {largest.numel} "
            f"tokens, is at most auto_min_tokens={config.auto_min_tokens}, where attention is cheap next to the rest (no "
            "speed-up, by design). For a speed-up at this size use method='tome' or 'todo', or a lower auto_min_tokens"
        )
