"""MiniMax-H3 (text/keyframe/reference to video and audio): one stack of single-stream blocks over a packed sequence.

``MiniMaxH3TransformerBlock``: pre-norm self-attention (``attn``, the rotary table passed positionally) and MLP
(``ff``) on the whole packed sequence, each modulated per row (by its timestep and modality) outside the sub-layer:
each is merged around itself, on the joint sequence, the target video's rows only. The token refiner's blocks (text
only) are not patched.

Token layout, read at the root from ``position_ids`` (S, 3), the (t, h, w) rotary coordinates of every row (one host
read per ids tensor: the modular pipeline passes the same one at every step). The pipelines pack
[text | keyframe conditions or references | audio | target video], the target video last:

- grid: the trailing rows, frame after frame of one rotary time each (rising), every frame the same (h, w)
  coordinates, row-major: a (frames, h, w) grid.
- text: ``encoder_hidden_states``' rows, first; whatever lies between them and the target video (conditioning video
  rows, audio rows) is a reference segment: never reduced.
- rotary: ``rotary_emb = (cos, sin)``, each (S, D), no batch dimension: gathered at each sample's kept rows.

Keys and values (todo/auto) are reduced at the dispatch call, after the rotary embedding. ``timestep`` holds the
sequence's distinct timesteps, not one per sample: the patch reads the target's (``timestep_indices`` of the last row),
which runs from 0 (noise) to 1 (clean).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algorithms import TokenGrid, TokenLayout
from ..algorithms.grid import Segment
from ..notices import warn_at_caller
from . import Family
from .base import DECLINED, Argument, BlockLayout, Container, Declined, DenoiserLayout, Follow, HostReads, KeyValueSite, Span, text_length

ROTARY = Follow("rotary_emb", dim=0, stream="joint")


def _target_grid(position_ids: torch.Tensor) -> tuple[int, int, int] | None:
    """(frames, h, w) of the trailing frames of ``position_ids``: one rotary time per frame, rising, each frame the
    same row-major (h, w) coordinates (None: no such frames)."""
    rows = position_ids.tolist()
    last = rows[-1][0]
    n = next((i for i, r in enumerate(reversed(rows)) if r[0] != last), len(rows))
    frame = [(r[1], r[2]) for r in rows[len(rows) - n :]]
    w = next((i for i, (h, _) in enumerate(frame) if h != frame[0][0]), n)
    if n % w or any(frame[i] != (frame[i - i % w][0], frame[i % w][1]) for i in range(n)):
        return None
    frames, end, time = 1, len(rows) - n, last
    while end >= n:
        before = rows[end - n : end]
        if any(r[0] != before[0][0] for r in before) or before[0][0] >= time or [(r[1], r[2]) for r in before] != frame:
            break
        frames, end, time = frames + 1, end - n, before[0][0]
    return frames, n // w, w


class PackedSequence:
    """[text; references; target video] of a packed MiniMax-H3 call (see the module's docstring)."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.ids, self.text = Argument(root, "position_ids"), Argument(root, "encoder_hidden_states")
        self.patch = tuple(root.config.patch_size)
        self.reads = HostReads()
        self.warned = False

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | Declined | None:
        ids = self.ids(args, kwargs)
        if not isinstance(ids, torch.Tensor) or ids.ndim != 2:
            return None
        shape, text = self.reads(ids, _target_grid), text_length(self.text(args, kwargs))
        between = ids.shape[0] - text - (0 if shape is None else shape[0] * shape[1] * shape[2])
        if shape is None or between < 0:
            if not self.warned:
                self.warned = True
                warn_at_caller("tokenmerge: MiniMax-H3 calls whose last rows are not a video's frames run unchanged")
            return DECLINED
        grid = TokenGrid(shape, patch=self.patch)
        parts = [Segment("text", text), Segment("reference", between), Segment("image", grid.numel, grid)]
        return TokenLayout(tuple(s for s in parts if s.length))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "warned": False}


class TargetTimestep:
    """The target video's timestep, as a (1,) tensor: ``timestep`` holds the packed sequence's distinct timesteps
    (not one per sample) and ``timestep_indices`` each row's index into them, the target's rows last (no host read)."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.timestep, self.indices = Argument(root, "timestep"), Argument(root, "timestep_indices")

    def __call__(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        t, indices = self.timestep(args, kwargs), self.indices(args, kwargs)
        if not isinstance(t, torch.Tensor) or not isinstance(indices, torch.Tensor) or t.ndim != 1 or not indices.numel():
            return t
        return t.index_select(0, indices[-1:].to(t.device))


@dataclass
class PackedDenoiser(DenoiserLayout):
    """A MiniMax-H3 denoiser: its timestep read at the target's rows."""

    def timestep_reader(self) -> TargetTimestep:
        return TargetTimestep(self.root)


def _block(block: torch.nn.Module) -> BlockLayout:
    spans = [
        Span("merge_attn", block.attn, block.attn, stream="joint", follows=((block.attn, ROTARY),), name="attn"),
        Span("merge_mlp", block.ff, block.ff, stream="joint", name="ff"),
    ]
    return BlockLayout(block, spans, [KeyValueSite(block.attn, stream="joint")], input_stream="joint", kind=type(block).__name__)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [_block(b) for b in getattr(module, "transformer_blocks", None) or []]
    if not blocks:
        return None
    return PackedDenoiser(module, [Container(module, blocks, 1, PackedSequence(module))], "minimax-h3", single_level=True)


FAMILY = Family(
    px=(32, 3),  # 2x2 patches of its VAE's 16 px cells; 17 frames per 5 latent frames (3.4)
    name="minimax-h3",
    title="MiniMax-H3",
    classes=("MiniMaxH3Transformer3DModel",),
    layout=layout,
    # only a modular pipeline (MiniMaxH3ModularPipeline), not a DiffusionPipeline: its transformer is patched itself
    timesteps=(0.0, 1.0),  # 0 at pure noise, 1 clean (the conditioning rows' level)
    notes="grid: the trailing rows of position_ids (t, h, w), one rotary time per frame, one host read per ids tensor; "
    "text: encoder_hidden_states, first; conditioning video and audio rows between: never reduced; rotary: rotary_emb "
    "(cos, sin), each (S, D), gathered at each sample's kept rows",
)
