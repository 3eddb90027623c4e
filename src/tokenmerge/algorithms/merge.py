"""Token matching and merging for ToMe for SD, as pure tensor algorithms (no model knowledge).

A block's N tokens (a grid of any rank) are split into destinations (one per window: sy×sx on an image,
st×sy×sx on a video) and sources (the rest, including the borders that do not fill a window). Each source is paired with its most
cosine-similar destination; the r best-paired sources are averaged into their destinations. The
result is a :class:`MergePlan` that shrinks (B, N, C) tensors to (B, N - r, C) and restores them.

Only gather, scatter_add and elementwise ops are used (no ``scatter_reduce(mean)``, which MPS, XPU,
DirectML and ONNX lack), and unmerging is a single gather.

Ties: a source whose two best destinations score equally (within float rounding) may pair with either;
which one wins depends on the order of float operations, so it can differ between CPUs and between two
implementations of the same rule (tomesd's own results differ between machines there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from .grid import TokenGrid


def grid_partition(
    grid: TokenGrid, window: tuple[int, ...], offsets: torch.Tensor | None, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split the row-major token positions of ``grid`` into (sources, destinations): one destination per
    ``window`` (a size per axis: (sy, sx) on an image, (st, sy, sx) on a video).

    ``offsets`` (B', windows) picks each window's destination (its row-major position inside the window);
    ``None`` picks the first one. Returns int64 index tensors of shapes (B', N - windows) and (B', windows),
    sources in increasing position order. Axes not filled by whole windows (borders) are all sources.
    """
    counts = [size // win for size, win in zip(grid.shape, window)]
    num_windows = math.prod(counts)
    if offsets is None:
        offsets = torch.zeros(1, num_windows, dtype=torch.int64, device=device)
    offsets = offsets.view(offsets.shape[0], *counts)
    dst = torch.zeros_like(offsets)
    inner = math.prod(window)
    for axis, (count, win) in enumerate(zip(counts, window)):
        inner //= win
        shape = [1] * (len(counts) + 1)
        shape[axis + 1] = count
        coordinate = torch.arange(count, device=device).view(shape) * win + (offsets // inner) % win
        dst = dst * grid.shape[axis] + coordinate
    dst = dst.flatten(1)
    n = grid.numel
    is_dst = torch.zeros(dst.shape[0], n, dtype=torch.int32, device=device)
    is_dst.scatter_(1, dst, 1)
    src = is_dst.argsort(dim=1, stable=True)[:, : n - num_windows]
    return src, dst


class TokenSpan(Protocol):
    """The span protocol: what a stretch of a block (an attention, an MLP, a whole block) runs on instead of all its
    tokens, and how its output is spread back. ``gather`` (B, N, C) -> (B, K, C): the tokens the stretch runs on;
    ``scatter`` (B, K, C) -> (B, N, C): every token's output from them (``span``: which of the block's spans, for
    a span that keeps state per span); ``keep_idx`` (B, K): where each gathered token sits (the row of a position table
    or mask it takes); ``rows``: the plan of a slice of the batch (None where it cannot be sliced); ``whole``: it keeps
    every token (nothing to gather); ``fills_keys``: its attentions attend to every token's keys and values, which
    ``fill_keys(site, key, value, mask, start)`` gives them. ToMe's :class:`MergePlan` implements it (gather = average
    into destinations, scatter = copy back), and so does a selection of the tokens to recompute that keeps the others'
    outputs across steps. The hooks use nothing else (:mod:`tokenmerge.hooks.tokens`)."""

    keep_idx: torch.Tensor
    whole: bool
    fills_keys: bool

    @property
    def batch_size(self) -> int: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def num_kept(self) -> int: ...

    def gather(self, x: torch.Tensor, span: int = 0) -> torch.Tensor: ...

    def scatter(self, y: torch.Tensor, span: int = 0) -> torch.Tensor: ...

    def rows(self, start: int, stop: int) -> TokenSpan | None: ...


# The ``span`` a plan around a whole block keeps its state under (a span's is its index in the block).
AROUND_BLOCK = -1


def restore_residual(plan: TokenSpan, start: int, x: torch.Tensor, gathered: torch.Tensor, y: torch.Tensor, span: int = 0) -> torch.Tensor:
    """Every token's output of a stretch (a whole block) that ran on ``plan``'s tokens: ``x`` (B, S, C) its input,
    its image segment from ``start`` on, ``gathered`` (B, K, C) the image tokens as they went in, ``y`` (B, S - N + K,
    C) its output. Each image token is its input plus the residual the plan scatters to it (a merged token's, the
    residual its destination got); the other tokens of ``y`` in place."""
    n, k = plan.num_tokens, plan.num_kept
    residual = plan.scatter(y[:, start : start + k] - gathered, span)
    if start == 0 and k == y.shape[1]:
        return x + residual
    out = y.new_empty(y.shape[0], y.shape[1] - k + n, y.shape[2])  # written once (a sum and a concatenation copy twice)
    out[:, :start] = y[:, :start]
    torch.add(x[:, start : start + n], residual, out=out[:, start : start + n])
    out[:, start + n :] = y[:, start + k :]
    return out


@dataclass
class MergePlan:
    """How one block's tokens are merged: (B, N, C) -> (B, N - r, C) and back.

    The merged sequence is ``[unmerged sources (best-matched first) | destinations]``, the layout of
    tomesd. ``unmerge_idx`` maps every original position to the merged slot that holds its value.
    A plan with batch size 1 applies to every sample of a batch (a plan shared by the batch).
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
    def num_kept(self) -> int:
        return self.keep_idx.shape[1]

    @property
    def batch_size(self) -> int:
        return self.unmerge_idx.shape[0]

    @staticmethod
    def _index(idx: torch.Tensor, batch: int, channels: int) -> torch.Tensor:
        return idx[..., None].expand(batch, -1, channels)

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        """Average each merged source into its destination: (B, N, C) -> (B, N - r, C)."""
        b, c = x.shape[0], x.shape[-1]
        kept = x.gather(1, self._index(self.keep_idx, b, c))
        src = x.gather(1, self._index(self.src_idx, b, c))
        kept = kept.scatter_add(1, self._index(self.dst_slot, b, c), src)
        return kept / self.counts.to(x.dtype)

    def unmerge(self, y: torch.Tensor) -> torch.Tensor:
        """Copy each slot's value back to every position it stands for: (B, N - r, C) -> (B, N, C)."""
        return y.gather(1, self._index(self.unmerge_idx, y.shape[0], y.shape[-1]))

    whole = False  # the span protocol (TokenSpan): a merge keeps fewer tokens
    fills_keys = False  # its attentions attend to the merged tokens only

    def gather(self, x: torch.Tensor, span: int = 0) -> torch.Tensor:
        return self.merge(x)

    def scatter(self, y: torch.Tensor, span: int = 0) -> torch.Tensor:
        return self.unmerge(y)

    def rows(self, start: int, stop: int) -> MergePlan:
        """The plan of batch rows [start, stop), for callers that process a batch in chunks."""
        if self.batch_size == 1:
            return self
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
        node_max, node_idx = best_destinations(a, d)
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


# Elements of the (B, sources, destinations) similarity matrix computed at once (256 MB in fp32): a 480p video's 33k
# tokens would need 0.8 GB per sample in one piece, SD at 2048 px 3.2 GB; above this the sources go in chunks.
SIMILARITY_CHUNK = 1 << 26


def best_destinations(a: torch.Tensor, d: torch.Tensor, chunk: int = SIMILARITY_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """Each source's best cosine similarity and destination, (B, Ns) each, from unit-normalised sources ``a``
    (B, Ns, C) and destinations ``d`` (B, Nd, C), without holding more than ``chunk`` similarities at once
    (the rows are independent: the result is the dense one's)."""
    b, ns, nd = a.shape[0], a.shape[1], d.shape[1]
    dt = d.transpose(-1, -2)
    if b * ns * nd <= chunk:
        return (a @ dt).max(dim=-1)
    rows = max(1, chunk // max(1, b * nd))
    parts = [(a[:, i : i + rows] @ dt).max(dim=-1) for i in range(0, ns, rows)]
    return torch.cat([p.values for p in parts], dim=1), torch.cat([p.indices for p in parts], dim=1)


def batch_metric(metric: torch.Tensor) -> torch.Tensor:
    """One (1, N, C) metric for a plan shared by the batch: the mean of the samples' unit-normalised tokens."""
    return (metric / metric.norm(dim=-1, keepdim=True)).mean(0, keepdim=True)
