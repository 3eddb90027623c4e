"""One block's merge plan from its input tokens, options, identity and timestep (shared by all front ends)."""

from __future__ import annotations

import math

import torch

from .config import TokenMergeConfig
from .matching import MergePlan, bipartite_soft_matching, grid_partition, hash32, random_offsets


def timestep_keys(block_key: int, seed: int, timestep: torch.Tensor | None, batch: int, device: torch.device) -> torch.Tensor:
    """One 32-bit key per sample from (seed, block, timestep); samples with equal timesteps share a key.

    ``timestep`` may hold one value, one per sample, or one per group of samples (video frames).
    """
    base = torch.tensor([block_key ^ seed], device=device, dtype=torch.int64)
    if timestep is None:
        return hash32(base)
    t = timestep.flatten().to(device)
    if t.numel() != 1:
        t = t.repeat_interleave(batch // t.numel()) if batch % t.numel() == 0 else t[:1]
    # Quantise so that fractional timesteps and sigmas (k-diffusion samplers) still give distinct keys.
    quantised = (t.float() * 64).round().to(torch.int64)
    return hash32(base ^ hash32(quantised))


def auto_kv_factor(tokens: int, max_keys: int, min_tokens: int) -> int:
    """method="auto": the key/value downsampling factor of a block with ``tokens`` tokens.

    Grids of at most ``min_tokens`` tokens are left alone (factor 1): there attention is cheap next to
    the block's projections and MLP, and downsampling does not pay (measured on CPU: 0.96x on a 32x32
    SD 1.5 block). Larger grids get the smallest integer factor f >= 2 with tokens / f**2 <= max_keys,
    so attention cost stays about linear in the token count. Integer (not power-of-two) factors keep
    the key count near the budget at every resolution.
    """
    if tokens <= min_tokens:
        return 1
    return max(2, math.ceil(math.sqrt(tokens / max_keys)))


def kv_factor_for(config: TokenMergeConfig, tokens: int) -> int:
    """The key/value downsampling factor of a block with ``tokens`` tokens: fixed for method todo, the
    per-block rule for auto (1 = leave the block alone)."""
    if config.method == "auto":
        return auto_kv_factor(tokens, config.auto_max_keys, config.auto_min_tokens)
    return config.kv_factor


def plan_merge(
    x: torch.Tensor, h: int, w: int, config: TokenMergeConfig, block_key: int, timestep: torch.Tensor | None
) -> MergePlan | None:
    """Match the (B, h*w, C) tokens ``x`` and return how to merge ``int(h*w*ratio)`` of them (or None)."""
    offsets = None
    if config.use_rand:
        keys = timestep_keys(block_key, config.effective_seed, timestep, x.shape[0], x.device)
        offsets = random_offsets(keys, (h // config.sy) * (w // config.sx), config.sx * config.sy)
    src, dst = grid_partition(h, w, config.sx, config.sy, offsets, x.device)
    dtype = None if config.match_dtype is None else getattr(torch, config.match_dtype)
    return bipartite_soft_matching(x, src, dst, int(h * w * config.ratio), dtype)
