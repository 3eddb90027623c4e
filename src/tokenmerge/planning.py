"""One block's merge plan from its input tokens, options, identity and timestep (shared by all front ends)."""

from __future__ import annotations

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


def plan_merge(
    x: torch.Tensor, h: int, w: int, config: TokenMergeConfig, block_key: int, timestep: torch.Tensor | None
) -> MergePlan | None:
    """Match the (B, h*w, C) tokens ``x`` and return how to merge ``int(h*w*ratio)`` of them (or None)."""
    offsets = None
    if config.use_rand:
        keys = timestep_keys(block_key, config.effective_seed, timestep, x.shape[0], x.device)
        offsets = random_offsets(keys, (h // config.sy) * (w // config.sx), config.sx * config.sy)
    src, dst = grid_partition(h, w, config.sx, config.sy, offsets, x.device)
    return bipartite_soft_matching(x, src, dst, int(h * w * config.ratio))
