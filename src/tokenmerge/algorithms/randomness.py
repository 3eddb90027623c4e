"""Device-independent randomness for the merge partition: integer hashing instead of generator state.

Every key is a pure function of (seed, block, timestep), computed with integer ops on the tensor's own
device, so results never depend on earlier calls, on the global RNG, on the batch a sample sits in, or on
the device: no generator state, no host synchronisation.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
_HASH_MULT = 0x45D9F3B
_GOLDEN = 0x9E3779B9
# Timesteps and sigmas are quantised at this resolution before hashing: distinct for integer timesteps,
# for k-diffusion sigmas and for flow-matching times in [0, 1] (Flux, SD3) alike.
_TIMESTEP_SCALE = 1024


def hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixing function on int64 tensors (values kept below 2**32, so no overflow)."""
    x = x & MASK32
    x = (((x >> 16) ^ x) * _HASH_MULT) & MASK32
    x = (((x >> 16) ^ x) * _HASH_MULT) & MASK32
    return (x >> 16) ^ x


def hash_ints(*values: int) -> int:
    """Fold non-negative Python ints below 2**32 (block index, stage, ...) into one 32-bit key."""
    key = 0
    for v in values:
        key = int(hash32(torch.tensor((key ^ (v & MASK32)) & MASK32)))
    return key


def fold_seed(seed: int) -> int:
    """A 32-bit key from any Python int, using all of its bits (seeds that differ anywhere differ here).

    Seeds in [0, 2**32) are their own key, so small seeds keep the partitions they always had."""
    if 0 <= seed <= MASK32:
        return seed
    words = [1 if seed < 0 else 0]
    magnitude = abs(seed)
    while magnitude:
        words.append(magnitude & MASK32)
        magnitude >>= 32
    return hash_ints(0x5EED, len(words), *words)


def timestep_keys(
    block_key: int | torch.Tensor, seed_key: int, timestep: torch.Tensor | None, batch: int, device: torch.device
) -> torch.Tensor:
    """One 32-bit key per sample from (seed, block, timestep); samples with equal timesteps share a key.

    ``timestep`` may hold one value, one per sample, one per group of samples (video frames), or one per token of
    each sample (image-to-video's per-token timesteps: a sample's largest, the step's, not its clean frame's 0).
    ``block_key`` may be a one-element int64 tensor: a compiled graph then takes it as an input, where an int would
    be a constant of the graph (one graph per block).
    """
    if isinstance(block_key, torch.Tensor):
        base = (block_key.to(device=device, dtype=torch.int64).view(1) ^ seed_key) & MASK32
    else:
        base = torch.tensor([(block_key ^ seed_key) & MASK32], device=device, dtype=torch.int64)
    if timestep is None:
        return hash32(base)
    t = timestep.flatten().to(device)
    if t.numel() != 1:
        if batch % t.numel() == 0:
            t = t.repeat_interleave(batch // t.numel())
        elif t.numel() % batch == 0:
            t = t.view(batch, -1).amax(1)
        else:
            t = t[:1]
    quantised = (t.double() * _TIMESTEP_SCALE).round().to(torch.int64)
    return hash32(base ^ hash32(quantised))


def random_offsets(keys: torch.Tensor, num_windows: int, choices: int) -> torch.Tensor:
    """One pseudo-random offset in [0, choices) per window, for each row's key: (B, num_windows)."""
    windows = torch.arange(num_windows, device=keys.device, dtype=torch.int64)
    return hash32(hash32(keys[:, None]) ^ hash32(windows * _GOLDEN)) % choices
