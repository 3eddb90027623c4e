"""Token matching and merging for ToMe for SD, as pure tensor algorithms (no model knowledge).

A block's N = h*w tokens are split into destinations (one per sx×sy window) and sources (the rest,
including the border rows/columns that do not fill a window). Each source is paired with its most
cosine-similar destination; the r best-paired sources are averaged into their destinations. The
result is a :class:`MergePlan` that shrinks (B, N, C) tensors to (B, N - r, C) and restores them.

Only gather, scatter_add and elementwise ops are used (no ``scatter_reduce(mean)``, which MPS, XPU,
DirectML and ONNX lack), and unmerging is a single gather.
"""

from __future__ import annotations

from dataclasses import dataclass

import math

import torch
import torch.nn.functional as F

_MASK32 = 0xFFFFFFFF
_HASH_MULT = 0x45D9F3B
_GOLDEN = 0x9E3779B9


def hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixing function on int64 tensors (values kept below 2**32, so no overflow).

    Computed with plain integer ops on the tensor's own device: the random partition is the same on
    every device, needs no generator state and no host synchronisation.
    """
    x = x & _MASK32
    x = (((x >> 16) ^ x) * _HASH_MULT) & _MASK32
    x = (((x >> 16) ^ x) * _HASH_MULT) & _MASK32
    return (x >> 16) ^ x


def hash_ints(*values: int) -> int:
    """Fold Python ints (seed, block index, ...) into one 32-bit key with :func:`hash32`."""
    key = 0
    for v in values:
        key = int(hash32(torch.tensor((key ^ (v & _MASK32)) & _MASK32)))
    return key


def random_offsets(keys: torch.Tensor, num_windows: int, choices: int) -> torch.Tensor:
    """One pseudo-random offset in [0, choices) per window, for each row's key: (B, num_windows)."""
    windows = torch.arange(num_windows, device=keys.device, dtype=torch.int64)
    return hash32(hash32(keys[:, None]) ^ hash32(windows * _GOLDEN)) % choices


def grid_partition(
    h: int, w: int, sx: int, sy: int, offsets: torch.Tensor | None, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split the h*w row-major token positions into (sources, destinations).

    ``offsets`` (B', hsy*wsx) picks each window's destination (dy*sx + dx); ``None`` picks the
    top-left token. Returns int64 index tensors of shapes (B', N - hsy*wsx) and (B', hsy*wsx),
    sources in increasing position order.
    """
    hsy, wsx = h // sy, w // sx
    if offsets is None:
        offsets = torch.zeros(1, hsy * wsx, dtype=torch.int64, device=device)
    offsets = offsets.view(offsets.shape[0], hsy, wsx)
    rows = torch.arange(hsy, device=device)[:, None] * sy + offsets // sx
    cols = torch.arange(wsx, device=device)[None, :] * sx + offsets % sx
    dst = (rows * w + cols).flatten(1)
    is_dst = torch.zeros(dst.shape[0], h * w, dtype=torch.int32, device=device)
    is_dst.scatter_(1, dst, 1)
    src = is_dst.argsort(dim=1, stable=True)[:, : h * w - hsy * wsx]
    return src, dst


@dataclass
class MergePlan:
    """How one block's tokens are merged: (B, N, C) -> (B, N - r, C) and back.

    The merged sequence is ``[unmerged sources (best-matched first) | destinations]``, the layout of
    tomesd. ``unmerge_idx`` maps every original position to the merged slot that holds its value.
    """

    keep_idx: torch.Tensor  # (B, N - r) original position of each merged slot
    src_idx: torch.Tensor  # (B, r) positions averaged into a destination
    dst_slot: torch.Tensor  # (B, r) merged slot of each of those sources' destination
    counts: torch.Tensor  # (B, N - r, 1) tokens averaged into each slot (1 where none were merged)
    unmerge_idx: torch.Tensor  # (B, N)

    @property
    def num_tokens(self) -> int:
        return self.unmerge_idx.shape[1]

    @property
    def batch_size(self) -> int:
        return self.unmerge_idx.shape[0]

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        """Average each merged source into its destination: (B, N, C) -> (B, N - r, C)."""
        c = x.shape[-1]
        kept = x.gather(1, self.keep_idx[..., None].expand(-1, -1, c))
        src = x.gather(1, self.src_idx[..., None].expand(-1, -1, c))
        kept = kept.scatter_add(1, self.dst_slot[..., None].expand(-1, -1, c), src)
        return kept / self.counts.to(x.dtype)

    def unmerge(self, y: torch.Tensor) -> torch.Tensor:
        """Copy each slot's value back to every position it stands for: (B, N - r, C) -> (B, N, C)."""
        return y.gather(1, self.unmerge_idx[..., None].expand(-1, -1, y.shape[-1]))

    def rows(self, start: int, stop: int) -> MergePlan:
        """The plan of batch rows [start, stop), for callers that process a batch in chunks."""
        return MergePlan(*(t[start:stop] for t in (self.keep_idx, self.src_idx, self.dst_slot, self.counts, self.unmerge_idx)))


def bipartite_soft_matching(
    metric: torch.Tensor, src_pos: torch.Tensor, dst_pos: torch.Tensor, r: int, dtype: torch.dtype | None = None
) -> MergePlan | None:
    """Pair each source with its most similar destination and merge the r best pairs.

    ``metric`` is (B, N, C); ``src_pos``/``dst_pos`` come from :func:`grid_partition` (one row
    shared by the batch, or one per sample). ``r`` is clamped to the number of sources. ``dtype``
    (default: the metric's) is the precision of the similarity matmul, the dominant cost. Returns
    ``None`` when nothing is merged (also when the grid is smaller than one window).
    """
    b, n, _ = metric.shape
    r = min(r, src_pos.shape[1])
    if r <= 0 or dst_pos.shape[1] == 0:
        return None
    with torch.no_grad():
        metric = metric / metric.norm(dim=-1, keepdim=True)
        src_pos = src_pos.expand(b, -1)
        dst_pos = dst_pos.expand(b, -1)
        c = metric.shape[-1]
        a = metric.gather(1, src_pos[..., None].expand(-1, -1, c))
        d = metric.gather(1, dst_pos[..., None].expand(-1, -1, c))
        if dtype is not None:
            a, d = a.to(dtype), d.to(dtype)
        node_max, node_idx = (a @ d.transpose(-1, -2)).max(dim=-1)
        order = node_max.argsort(dim=-1, descending=True)
        merged, unmerged = order[:, :r], order[:, r:]
        num_unmerged = unmerged.shape[1]
        keep_idx = torch.cat([src_pos.gather(1, unmerged), dst_pos], dim=1)
        src_idx = src_pos.gather(1, merged)
        dst_slot = node_idx.gather(1, merged) + num_unmerged
        kept = keep_idx.shape[1]
        counts = torch.ones(b, kept, device=metric.device, dtype=torch.float32)
        counts.scatter_add_(1, dst_slot, torch.ones(b, r, device=metric.device, dtype=torch.float32))
        unmerge_idx = torch.empty(b, n, dtype=torch.int64, device=metric.device)
        unmerge_idx.scatter_(1, keep_idx, torch.arange(kept, device=metric.device).expand(b, -1))
        unmerge_idx.scatter_(1, src_idx, dst_slot)
    return MergePlan(keep_idx, src_idx, dst_slot, counts[..., None], unmerge_idx)


def downsample_tokens(x: torch.Tensor, h: int, w: int, factor: int, mode: str) -> torch.Tensor:
    """Token downsampling (ToDo): (B, h*w, C) -> (B, ceil(h/f)*ceil(w/f), C) by spatial interpolation."""
    if factor == 1:
        return x
    b, _, c = x.shape
    grid = x.transpose(1, 2).reshape(b, c, h, w)
    size = (math.ceil(h / factor), math.ceil(w / factor))
    return F.interpolate(grid, size=size, mode=mode).flatten(2).transpose(1, 2)
