"""One rank's part of a token sequence under sequence (context) parallelism, and the keys it keeps.

diffusers' context parallelism splits a model's sequences into ``world`` contiguous chunks at the model's entry
(``torch.chunk``; ``tensor_split`` in its "anything" modes): the image stream (target image, then any reference
images) and, where the model's plan says so, the text. Each rank's blocks then see ``[its text; its image chunk]``,
and every attention gathers the other ranks' keys (Ulysses all-to-all, or a ring). A :class:`Shard` says where a
rank's image tokens sit in the whole grid, so that:

- key/value downsampling keeps exactly the keys a single process keeps (the whole grid's selection, restricted to
  the rank's chunk) — then the gathered keys are the single process's, in another order, and attention is the same;
  where the ranks' shares differ in size (a chunk boundary inside a factor's window), each rank keeps as many as
  the largest share, its extra keys being its first unselected positions (the collectives need equal lengths);
- ToMe merges within a rank's chunk when the chunk is a box of the grid (a band of whole rows or frames);
- a selection of tokens to recompute is made in the whole grid's windows (:meth:`Shard.windows`): what one process chooses, plus one
  token per window a chunk boundary cuts, and a rank meeting fewer windows tops up to the largest count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .downsample import nearest_indices
from .grid import Segment, TokenGrid, TokenLayout


def chunk_bounds(total: int, world: int, uneven: bool = False) -> list[tuple[int, int]]:
    """(start, stop) of each rank's chunk of ``total`` tokens: ``torch.chunk`` (``uneven``: ``tensor_split``)."""
    if uneven:
        base, extra = divmod(total, world)
        sizes = [base + (r < extra) for r in range(world)]
    else:
        size = math.ceil(total / world)
        sizes = [max(0, min(size, total - r * size)) for r in range(world)]
    starts = [sum(sizes[:r]) for r in range(world)]
    return [(s, s + n) for s, n in zip(starts, sizes)]


def box_of(grid: TokenGrid, start: int, length: int) -> TokenGrid | None:
    """The sub-grid that positions ``[start, start + length)`` of ``grid`` (row-major) form when they are a box of
    whole trailing slices (a band of whole frames, or of whole rows within a frame), else None."""
    shape = grid.shape
    for axis in range(len(shape)):
        tail = math.prod(shape[axis + 1 :])
        if length % tail or start % tail:
            continue
        extent = length // tail
        if extent <= shape[axis] and (start // tail) % shape[axis] + extent <= shape[axis]:
            return TokenGrid((1,) * axis + (extent,) + shape[axis + 1 :], grid.axes)
    return None


@dataclass(frozen=True)
class Shard:
    """A rank's chunk ``[start, start + length)`` of the ``whole`` target grid (row-major positions), out of ``world``
    chunks ``bounds``; ``box``: the chunk as a sub-grid, when it is one."""

    whole: TokenGrid
    start: int
    length: int
    rank: int
    world: int
    bounds: tuple[tuple[int, int], ...]
    box: TokenGrid | None

    def kept(self, factors: tuple[int, ...], mode: str, device: torch.device) -> tuple[torch.Tensor, list[int]]:
        """The rank's image positions (0-based in its chunk) that a nearest downsampling of the whole grid by
        ``factors`` keeps, topped up to the largest rank's count with its first unselected positions; and every
        rank's own count (before topping up)."""
        selected = nearest_indices(self.whole, factors, mode, device)
        counts = [int(((selected >= a) & (selected < b)).sum()) for a, b in self.bounds]
        mine = selected[(selected >= self.start) & (selected < self.start + self.length)] - self.start
        missing = max(counts) - mine.numel()
        if missing > 0:
            free = torch.ones(self.length, dtype=torch.bool, device=device)
            free[mine] = False
            mine = torch.cat([mine, free.nonzero().flatten()[:missing]])
        return mine, counts

    def windows(self, size: int) -> tuple[int, int]:
        """Windows of ``size`` consecutive positions of the whole grid on this chunk: how far into its first window
        the chunk starts, and the most windows any rank's chunk meets (the count each rank chooses, equal for the
        collectives)."""

        def met(a: int, b: int) -> int:
            return 0 if b <= a else (b - 1) // size - a // size + 1

        return self.start % size, max(met(a, b) for a, b in self.bounds)


def shard_layout(layout: TokenLayout, rank: int, world: int, text_split: bool, uneven: bool = False) -> TokenLayout | str:
    """The layout a rank's blocks see when the image stream (every non-text segment, in order) and, if
    ``text_split``, each text segment are cut into ``world`` chunks; a reason (str) where that cannot be described
    (a text or image stream that does not split into whole chunks the way diffusers splits it, a rank without
    image tokens)."""
    stream = [s for s in layout.segments if s.kind != "text"]
    total = sum(s.length for s in stream)
    if not uneven and total % world:
        return f"its {total} image-stream tokens do not split into {world} equal chunks"
    a, b = chunk_bounds(total, world, uneven)[rank]
    pieces: dict[int, Segment] = {}
    shard = None
    offset = 0
    for index, segment in enumerate(layout.segments):
        if segment.kind == "text":
            continue
        lo, hi = max(a, offset), min(b, offset + segment.length)
        if hi > lo:
            if segment is layout.segments[layout.target]:
                bounds = tuple((max(0, s - offset), max(0, min(segment.length, e - offset))) for s, e in chunk_bounds(total, world, uneven))
                box = box_of(segment.grid, lo - offset, hi - lo)
                shard = Shard(segment.grid, lo - offset, hi - lo, rank, world, bounds, box)
                grid = box if box is not None else TokenGrid((hi - lo,), ("tokens",))
                pieces[index] = Segment("image", hi - lo, grid)
            else:
                grid = segment.grid if segment.grid is not None and hi - lo == segment.length else None
                pieces[index] = Segment(segment.kind, hi - lo, grid)
        offset += segment.length
    if shard is None:
        return f"rank {rank} of {world} holds none of the image's tokens"
    segments = []
    for index, segment in enumerate(layout.segments):
        if segment.kind == "text":
            if text_split:
                if not uneven and segment.length % world:
                    return f"its {segment.length} text tokens do not split into {world} equal chunks"
                lo, hi = chunk_bounds(segment.length, world, uneven)[rank]
                if hi > lo:
                    segments.append(Segment("text", hi - lo))
            else:
                segments.append(segment)
        elif index in pieces:
            segments.append(pieces[index])
    return TokenLayout(tuple(segments), shard)
