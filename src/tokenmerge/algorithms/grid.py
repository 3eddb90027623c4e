"""Token grids of any rank and the layout of a token sequence: what every algorithm and hook is told about tokens.

A :class:`TokenGrid` is the shape of the image tokens before flattening (row-major): ``(height, width)`` for an
image, ``(frames, height, width)`` for a video. A :class:`TokenLayout` says which stretches of a sequence are text,
the generated image, or reference images (edits) — in the order the model concatenates them — so that a hook can
reduce the image segment of any sequence and leave every other token where it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .shards import Shard

_AXES = {1: ("width",), 2: ("height", "width"), 3: ("frames", "height", "width")}
KINDS = ("text", "image", "reference", "padding")
STREAMS = ("joint", "image", "target")


@dataclass(frozen=True)
class TokenGrid:
    """The shape of an image's (or video's) tokens, row-major, with named axes; ``patch`` is the latent size of one
    token along each axis (for describing, never for computing)."""

    shape: tuple[int, ...]
    axes: tuple[str, ...] = ()
    patch: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        shape = tuple([int(s) for s in self.shape])
        if not shape or any([s < 1 for s in shape]):
            raise ValueError(f"a token grid needs one or more axes of at least one token, got {self.shape!r}")
        object.__setattr__(self, "shape", shape)
        if not self.axes:
            object.__setattr__(self, "axes", _AXES.get(len(shape), tuple([f"axis{i}" for i in range(len(shape))])))
        if len(self.axes) != len(shape) or (self.patch and len(self.patch) != len(shape)):
            raise ValueError(f"a token grid's axes {self.axes} and patch {self.patch} must match its shape {shape}")

    @staticmethod
    def of(value: TokenGrid | tuple[int, ...] | list[int]) -> TokenGrid:
        """A grid from a grid or a tuple of sizes (``(h, w)``, ``(frames, h, w)``)."""
        return value if isinstance(value, TokenGrid) else TokenGrid(tuple(value))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def spatial(self, sx: int, sy: int, leading: int = 1) -> tuple[int, ...]:
        """A per-axis size from spatial sizes: ``sy`` on height, ``sx`` on width, ``leading`` on every axis before."""
        if self.rank == 1:
            return (sx,)
        return (leading,) * (self.rank - 2) + (sy, sx)

    def reduced(self, factors: tuple[int, ...]) -> TokenGrid:
        """The grid after downsampling by ``factors`` (per axis, rounding up)."""
        return TokenGrid(tuple([math.ceil(s / f) for s, f in zip(self.shape, factors)]), self.axes)

    def scaled(self, level: int) -> TokenGrid:
        """The grid of a UNet level downsampled ``level`` times spatially (leading axes unchanged)."""
        return self.reduced(self.spatial(level, level))

    def __str__(self) -> str:
        return "x".join(map(str, self.shape))


def kept_positions(keep: torch.Tensor, start: int, n: int, total: int) -> torch.Tensor:
    """Positions of a sequence of ``total`` that remain when its ``n`` image tokens from ``start`` keep ``keep`` ((K,)
    or per sample (B, K), their own positions): the other tokens whole, in place. (K,) -> (total - n + K,)."""
    lead = keep.shape[:-1]
    before = torch.arange(start, device=keep.device).expand(*lead, start)
    after = torch.arange(start + n, total, device=keep.device).expand(*lead, total - start - n)
    return torch.cat([before, start + keep, after], dim=-1)


def take_rows(table: torch.Tensor, dim: int, rows: torch.Tensor) -> torch.Tensor:
    """Each sample's ``rows`` (B, S') of a position table or mask along ``dim`` >= 1, whose dim 0 is the batch (B or
    1): (B or 1, ..., S, ...) -> (B, ..., S', ...)."""
    if table.shape[0] == 1:
        table = table.expand(rows.shape[0], *table.shape[1:])
    shape = [1] * table.ndim
    shape[0], shape[dim] = rows.shape
    return table.gather(dim, rows.view(shape).expand(*[rows.shape[1] if d == dim else s for d, s in enumerate(table.shape)]))


@dataclass(frozen=True)
class Segment:
    """A stretch of a token sequence: ``kind`` text, image (the generated one), reference (an edit's input image,
    with a grid of its own) or padding (rows a model pads the image to, as HiDream's), ``length`` tokens. Only
    the (first) image segment is ever reduced."""

    kind: str
    length: int
    grid: TokenGrid | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"a segment's kind must be one of {', '.join(KINDS)}, got {self.kind!r}")


@dataclass(frozen=True)
class TokenLayout:
    """The segments of a sequence in order; the first image segment is the one reduced (the target). ``shard``: under
    sequence parallelism, where this rank's target tokens sit in the whole grid (:mod:`.shards`)."""

    segments: tuple[Segment, ...]
    shard: Shard | None = None

    @staticmethod
    def image_only(grid: TokenGrid) -> TokenLayout:
        return TokenLayout((Segment("image", grid.numel, grid),))

    @staticmethod
    def joint(order: tuple[str, ...], grid: TokenGrid, text: int, references: tuple[TokenGrid | int, ...] = ()) -> TokenLayout:
        """[text; image; references] in ``order`` (kinds; "reference" stands for all reference segments, each a grid
        or a token count), empty segments left out."""
        parts: list[Segment] = []
        for kind in order:
            if kind == "text" and text:
                parts.append(Segment("text", text))
            elif kind == "image":
                parts.append(Segment("image", grid.numel, grid))
            elif kind == "reference":
                parts += [Segment("reference", g, None) if isinstance(g, int) else Segment("reference", g.numel, g) for g in references]
        return TokenLayout(tuple(parts))

    @property
    def total(self) -> int:
        return sum([s.length for s in self.segments])

    @property
    def target(self) -> int:
        return [s.kind for s in self.segments].index("image")

    @property
    def grid(self) -> TokenGrid:
        """The grid of the target image."""
        return self.segments[self.target].grid

    @property
    def image_start(self) -> int:
        return sum([s.length for s in self.segments[: self.target]])

    @property
    def text_tokens(self) -> int:
        return sum([s.length for s in self.segments if s.kind == "text"])

    @property
    def references(self) -> tuple[TokenGrid, ...]:
        return tuple([s.grid for s in self.segments if s.kind == "reference"])

    def stream(self, name: str) -> TokenLayout:
        """The layout of a stream: "joint" (this sequence), "image" (without the text, as a dual-stream block's
        image stream: the target and any references) or "target" (the target image alone, as Flux.3's per-mode
        blocks see it)."""
        if name not in STREAMS:
            raise ValueError(f"a stream must be one of {', '.join(STREAMS)}, got {name!r}")
        if name == "joint":
            return self
        if name == "target":
            return TokenLayout((self.segments[self.target],), self.shard)
        return TokenLayout(tuple([s for s in self.segments if s.kind != "text"]), self.shard)

    def kept_rows(self, keep: torch.Tensor) -> torch.Tensor:
        """Positions of this sequence that remain when the target image keeps ``keep`` (its own positions, in the
        merged order): every other segment whole, in place."""
        return kept_positions(keep, self.image_start, self.segments[self.target].length, self.total)

    def __str__(self) -> str:
        text = " ; ".join(f"{s.kind} {s.grid if s.grid is not None else s.length}" for s in self.segments)
        if self.shard is None:
            return text
        return f"{text} (rank {self.shard.rank} of {self.shard.world}: tokens {self.shard.start}-{self.shard.start + self.shard.length} of {self.shard.whole})"
