"""What each transformer block does in one call: the single decision shared by every front end.

The hooks (diffusers, ldm/sgm, every transformer family) and the ComfyUI patch callables only gather the facts (the
block's level, its tokens and their grid, the timestep) and call :func:`decide`; they never decide
themselves.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .algorithms import (
    MergePlan,
    TokenGrid,
    batch_metric,
    bipartite_soft_matching,
    grid_partition,
    hash_ints,
    random_offsets,
    timestep_keys,
)
from .config import TokenMergeConfig

_BLOCK_SALT = 0x70E


@dataclass(frozen=True)
class BlockAction:
    """One block's work in one call: merge with ``plan`` (tome), or downsample the keys and values of its
    ``kv_grid`` image tokens by ``kv_factors`` (one per grid axis; todo/auto), or nothing. ``kv_keep``: under
    sequence parallelism, the positions of this rank's image tokens whose keys and values are kept (the whole
    grid's selection; :meth:`tokenmerge.algorithms.Shard.kept`)."""

    plan: MergePlan | None = None
    kv_grid: TokenGrid | None = None
    kv_factors: tuple[int, ...] = ()
    kv_keep: torch.Tensor | None = None

    @property
    def kv_factor(self) -> int:
        """The spatial key/value factor (1 when keys and values are not downsampled)."""
        return self.kv_factors[-1] if self.kv_factors else 1

    @property
    def kv_label(self) -> str:
        """The factors as a user writes them: ``3`` (each spatial side) or ``2x3x3`` (frames x height x width)."""
        leading, spatial = self.kv_factors[:-2], self.kv_factors[-2:]
        if all([f == 1 for f in leading]) and len(set(spatial)) <= 1:
            return str(self.kv_factor)
        return "x".join(map(str, self.kv_factors))

    @property
    def idle(self) -> bool:
        return self.plan is None and self.kv_grid is None


IDLE = BlockAction()


def block_key(*identity: int) -> int:
    """The random-partition key of a block from its identity (index, or ComfyUI's stage/index/block)."""
    return hash_ints(_BLOCK_SALT, *identity)


def auto_kv_factor(tokens: int, max_keys: int, min_tokens: int, max_factor: int | None = None) -> int:
    """method="auto": the key/value downsampling factor of a block with ``tokens`` image tokens.

    Grids of at most ``min_tokens`` tokens are left alone (factor 1): there attention is cheap next to
    the block's projections and MLP, and downsampling does not pay. Larger grids get the smallest integer
    factor f >= 2 with tokens / f**2 <= max_keys, so attention cost stays about linear in the token count.
    Integer (not power-of-two) factors keep the key count near the budget at every resolution; ``max_factor``
    caps them (quality at large sizes).
    """
    if tokens <= min_tokens:
        return 1
    factor = max(2, math.ceil(math.sqrt(tokens / max_keys)))
    return factor if max_factor is None else min(factor, max_factor)


def auto_kv_factors(grid: TokenGrid, max_keys: int, min_tokens: int, max_factor: int | None = None) -> tuple[int, ...]:
    """method="auto": the key/value factor per axis of ``grid``.

    An image (or a one-frame video) gets :func:`auto_kv_factor` on both sides. A video of more than
    ``min_tokens`` tokens keeps every second frame's keys (latent frames are already 4 video frames apart and
    still alike; the model keeps every query) and each frame gets the image rule with ``max_keys`` per frame, so
    the key count grows with the frames, as the video's own detail does.
    """
    if grid.rank < 3 or grid.shape[0] == 1:
        f = auto_kv_factor(grid.numel, max_keys, min_tokens, max_factor)
        return grid.spatial(f, f)
    if grid.numel <= min_tokens:
        return (1,) * grid.rank
    frame = math.prod(grid.shape[-2:])
    f = auto_kv_factor(frame, max_keys, min_tokens, max_factor)
    return (1,) * (grid.rank - 3) + (2, f, f)


# How far above max_noise a call still counts as reduced: half of bfloat16's spacing near 1, so that a timestep the
# pipeline passed in bfloat16 counts as its step (t / 1000 = 0.4 arrives as 0.40039).
NOISE_TOLERANCE = 2**-9


def gated(config: TokenMergeConfig, noise: float | None) -> bool:
    """Whether the noise gate leaves a call at ``noise`` whole: its noise level is above ``max_noise`` (the method's
    default where unset) by more than :data:`NOISE_TOLERANCE` (0.4 admits up to 0.40195: a step at t = 401 of 1000,
    where DDIM's leading spacing puts one, is reduced). ``None`` (not read) is never gated."""
    return noise is not None and config.noise_limit < 1 and noise > config.noise_limit + NOISE_TOLERANCE


def noise_level(timestep: torch.Tensor, scale: tuple[float, float]) -> float:
    """The noise level of a call, 1 = pure noise and 0 = clean, from its ``timestep`` and the family's ``scale``
    (the timestep's value at pure noise and when clean: (1000, 0) for most models, (1, 0) where the pipeline divides
    by 1000, (0, 1) where it counts from noise to clean). The noisiest of the call's entries decides (a per-token
    timestep marks a clean condition frame with 0; the sample's step is the largest). One host read."""
    noisy, clean = scale
    extreme = timestep.detach().max() if noisy > clean else timestep.detach().min()
    return (float(extreme) - clean) / (noisy - clean)


def kv_factors_for(config: TokenMergeConfig, grid: TokenGrid) -> tuple[int, ...]:
    """The key/value downsampling factor per axis of a block on ``grid`` (all 1 = leave it alone)."""
    if config.method == "auto":
        return auto_kv_factors(grid, config.auto_max_keys, config.auto_min_tokens, config.auto_max_factor)
    return config.kv_factors(grid.rank)


def window_of(config: TokenMergeConfig, grid: TokenGrid) -> tuple[int, ...]:
    """The destination window of ToMe on ``grid``: sy×sx on the spatial axes, st frames on a video's."""
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


def decide(
    config: TokenMergeConfig,
    *,
    level: int,
    top_level: int,
    grid: TokenGrid | None,
    make_plan: Callable[[], MergePlan | None],
    whole: TokenGrid | None = None,
    noise: float | None = None,
    decides_cache: bool = False,
) -> BlockAction:
    """The block's action: nothing (identity options, a level not patched, no grid, a step noisier than
    ``max_noise``), a key/value factor (todo/auto) or a merge plan (tome, from ``make_plan``, which may come from a
    cache). ``whole``: under sequence parallelism, the whole grid ``grid`` is one rank's part of; key/value factors
    are chosen on it, so that every rank and a single process choose the same. ``noise``: the call's noise level
    (:func:`noise_level`; None where it is not read). ``decides_cache``: a step cache compares this block's output
    across steps to decide whether to run the blocks after it (:mod:`tokenmerge.hooks.step_caches`); ToMe's error
    there changes from step to step by more than the cache's threshold, so tome leaves the block alone (todo/auto
    downsample the same way at every step: their error moves with the tokens, and the cache still reuses steps)."""
    if config.is_identity or grid is None or not config.merges_level(level, top_level):
        return IDLE
    if gated(config, noise):
        return IDLE
    if config.method == "tome" and decides_cache:
        return IDLE
    if config.method != "tome":
        factors = kv_factors_for(config, whole or grid)
        return BlockAction(kv_grid=grid, kv_factors=factors) if max(factors) > 1 else IDLE
    plan = make_plan()
    return IDLE if plan is None else BlockAction(plan=plan)
