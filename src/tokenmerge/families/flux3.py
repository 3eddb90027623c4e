"""Flux.3: per-mode ``Flux3ModeTransformerBlock``s (the text, the target image and the condition images each
through blocks of their own), then joint ``Flux3SingleTransformerBlock``s over [text; image; condition images].

Both block kinds run attention and MLP in parallel on one normalised sequence, as two modules fed the same tensor,
so each gets a span of its own (the same plan): the image mode blocks on the target image alone (its own rotary
table), the joint blocks on the joint sequence (one table, rows [text; image; conditions]). The condition images
(``image_cond_hidden_states``: references for edits) are their own segment, never reduced; the text and condition
mode blocks are left alone. Grid from ``img_ids`` (t, row/2, col/2, l): the width is the number of ids sharing the
first row's coordinate, one host read per ids tensor; text length from ``encoder_hidden_states``.
"""

from __future__ import annotations

import torch

from ..algorithms import TokenGrid, TokenLayout
from . import Family
from .base import Argument, BlockLayout, Container, DenoiserLayout, Follow, HostReads, KeyValueSite, Span, text_length


def _parallel_block(block: torch.nn.Module, stream: str, input_stream: str) -> BlockLayout:
    rotary = Follow("image_rotary_emb", dim=0, stream=stream)
    spans = [
        Span("merge_attn", block.attn, block.attn, stream=stream, follows=((block.attn, rotary),), name="attn"),
        Span("merge_mlp", block.ff, block.ff, stream=stream, name="ff"),
    ]
    return BlockLayout(
        block,
        spans,
        [KeyValueSite(block.attn, stream=stream)],
        input_stream=input_stream,
        kind=type(block).__name__,
    )


class Flux3Layout:
    """[text; image; condition images] of a Flux.3 call."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.ids, self.tokens = Argument(root, "img_ids"), Argument(root, "hidden_states")
        self.text, self.conditions = Argument(root, "encoder_hidden_states"), Argument(root, "image_cond_hidden_states")
        self.reads = HostReads()

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        ids, x = self.ids(args, kwargs), self.tokens(args, kwargs)
        if not isinstance(ids, torch.Tensor) or ids.ndim != 2 or not isinstance(x, torch.Tensor) or ids.shape[0] != x.shape[1]:
            return None
        grid = self.reads(ids, _grid)
        if grid is None:
            return None
        conditions = self.conditions(args, kwargs)
        references = (conditions.shape[1],) if isinstance(conditions, torch.Tensor) and conditions.shape[1] else ()
        return TokenLayout.joint(("text", "image", "reference"), grid, text_length(self.text(args, kwargs)), references)


def _grid(ids: torch.Tensor) -> TokenGrid | None:
    """The image grid of Flux.3's ids: its width is the number of ids sharing the first row's coordinate."""
    w = int((ids[:, 1] == ids[0, 1]).sum())
    return TokenGrid((ids.shape[0] // w, w)) if ids.shape[0] % w == 0 else None


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    modes = getattr(module, "mode_blocks", None)
    blocks = [_parallel_block(b, "target", "target") for b in (modes["image"] if modes is not None and "image" in modes else [])]
    blocks += [_parallel_block(b, "joint", "image") for b in getattr(module, "single_transformer_blocks", [])]
    return DenoiserLayout(module, [Container(module, blocks, 1, Flux3Layout(module))], "flux3", single_level=True) if blocks else None


FAMILY = Family(
    name="flux3",
    title="Flux.3",
    timesteps=(1.0, 0.0),  # the modular pipeline passes timestep / 1000
    classes=("Flux3Transformer2DModel",),
    layout=layout,
    pipelines=(),  # diffusers 0.42.1 runs Flux.3 through its modular pipeline only (modular_pipelines/flux3)
    notes="grid: img_ids (t, row/2, col/2, l), width = ids sharing the first row, one host read per ids tensor; text: "
    "encoder_hidden_states, first; condition images: image_cond_hidden_states, after the image, never reduced; rotary: "
    "image_rotary_emb (cos, sin) per block kind (target only in the image mode blocks, [text; image; conditions] after)",
)
