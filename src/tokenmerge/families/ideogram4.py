"""Ideogram 4 (``Ideogram4Transformer2DModel``, the conditional and the unconditional transformer of its pipeline): a
single-stream DiT over one packed sequence [text padding; text; image].

The pipeline packs each sample as [left padding; prompt; image] to one length (the prompt padded on the left to
``max_sequence_length``, the image's packed 2x2 patches last, row-major) and says which token is which through
``indicator``, ``position_ids`` (B, S, 3) (the image's (t, row, col) offset by ``IMAGE_POSITION_OFFSET``) and
``segment_ids`` (the padding a segment of its own); the unconditional transformer gets the image alone. The blocks
(``Ideogram4TransformerBlock``) run attention (``attention``) and SwiGLU feed-forward (``feed_forward``) one after
the other on the packed sequence, each a merged span of its own over the joint stream, after the block's
modulation and before its gates.

Token layout, read at the root: the image is the rows of sample 0's ``position_ids`` at or past
``IMAGE_POSITION_OFFSET`` (one host read per ids tensor: the pipeline passes the same one every step), which must be
the last rows and one row-major grid; everything before it (left padding and prompt, whatever each sample's prompt
length) is text, never reduced. Calls laid out otherwise run unchanged, with a one-time warning.

Rotary: ``(cos, sin)``, each (B, S, head_dim), gathered per sample; the block-diagonal mask from ``segment_ids``
(``attention_mask``, (B, 1, S, S)) follows a merge on both its query rows and its key columns. Keys and values
(todo/auto) are reduced at ``dispatch_attention_fn``, after the rotary embedding.
"""

from __future__ import annotations

import torch

from ..algorithms import TokenGrid, TokenLayout
from ..notices import warn_at_caller
from . import Family
from .base import DECLINED, Argument, BlockLayout, Container, DenoiserLayout, Follow, HostReads, KeyValueSite, Span

IMAGE_POSITION_OFFSET = 65536  # diffusers' transformer_ideogram4.IMAGE_POSITION_OFFSET: image ids start there
ROTARY = Follow("image_rotary_emb", dim=1, stream="joint")
MASK_ROWS = Follow("attention_mask", dim=-2, stream="joint")
MASK_COLUMNS = Follow("attention_mask", dim=-1, stream="joint")


def block(module: torch.nn.Module) -> BlockLayout:
    attn, ff = module.attention, module.feed_forward
    follows = tuple((attn, f) for f in (ROTARY, MASK_ROWS, MASK_COLUMNS))
    spans = [
        Span("merge_attn", attn, attn, stream="joint", follows=follows, name="attention"),
        Span("merge_mlp", ff, ff, stream="joint", name="feed_forward"),
    ]
    return BlockLayout(module, spans, [KeyValueSite(attn, stream="joint")], input_stream="joint", kind=type(module).__name__)


def _image_grid(ids: torch.Tensor) -> tuple[int, TokenGrid] | None:
    """(image start, grid) of one sample's (S, 3) position ids: the rows at or past the image offset, last and row-major."""
    image = (ids[:, 0] >= IMAGE_POSITION_OFFSET).nonzero().flatten()
    if image.numel() == 0:
        return None
    start = int(image[0])
    rows = (ids[start:, 1:] - IMAGE_POSITION_OFFSET).long()
    h, w = int(rows[-1, 0]) + 1, int(rows[-1, 1]) + 1
    expected = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij"), -1).reshape(-1, 2)
    if image.numel() != ids.shape[0] - start or rows.shape != expected.shape or not torch.equal(rows.cpu(), expected):
        return None
    return start, TokenGrid((h, w), patch=(2, 2))


class Ideogram4Layout:
    """[text; image] of a packed call, from sample 0's ``position_ids`` (one host read per ids tensor)."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.ids, self.tokens = Argument(root, "position_ids"), Argument(root, "hidden_states")
        self.reads = HostReads()
        self.warned = False

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        ids, x = self.ids(args, kwargs), self.tokens(args, kwargs)
        if not isinstance(ids, torch.Tensor) or not isinstance(x, torch.Tensor) or ids.ndim != 3 or x.ndim != 3:
            return None
        found = self.reads(ids[0], _image_grid) if ids.shape[1] == x.shape[1] else None
        if found is None:
            if not self.warned:
                self.warned = True
                warn_at_caller(
                    "tokenmerge: Ideogram 4: the image tokens' position_ids are not the last rows of the sequence, in one "
                    "row-major grid; such calls run unchanged",
                )
            return DECLINED
        start, grid = found
        return TokenLayout.joint(("text", "image"), grid, start)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "warned": False}


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [block(b) for b in getattr(module, "layers", [])]
    if not blocks:
        return None
    return DenoiserLayout(module, [Container(module, blocks, 1, Ideogram4Layout(module))], "ideogram4", single_level=True)


FAMILY = Family(
    name="ideogram4",
    title="Ideogram 4",
    timesteps=(0.0, 1.0),  # the pipeline passes 1 - t / 1000: 0 is pure noise
    classes=("Ideogram4Transformer2DModel",),
    layout=layout,
    pipelines=("Ideogram4Pipeline",),
    notes="grid: the last rows of position_ids (image ids offset by 65536), row-major, one host read per ids tensor; "
    "text: every row before them (left padding and prompt); rotary: (cos, sin) (B, S, D) gathered per sample; the "
    "(B, 1, S, S) segment mask gathered on its rows and its columns; the unconditional transformer (image alone) too",
)
