"""Krea 2 (``Krea2Transformer2DModel``): a single-stream DiT over [text; image].

The root fuses the stack of tapped text-encoder layers into one text sequence (``text_fusion``: blocks of its own over
the text alone, not patched), concatenates [text; image] and runs its ``transformer_blocks``
(``Krea2TransformerBlock``) on the joint sequence: attention (``attn``) and SwiGLU feed-forward (``ff``) one after the
other, each a merged span of its own over the joint sequence, after the block's modulation (one vector per sample)
and before its gates.

Token layout, read at the root:

- grid: the image rows of ``position_ids`` (S, 3) (t, row, col), after the text's all-zero rows; the packed 2x2
  patches of ``hidden_states`` (B, N, C). One host read per ids tensor (the pipeline passes the same one every step).
- text: ``encoder_hidden_states.shape[1]`` ((B, T, layers, C): the padded length), first, never reduced.
- rotary: ``(cos, sin)``, each (S, head_dim) for the joint sequence, no batch dimension: gathered at each sample's
  kept rows; the key-padding mask (``attention_mask`` (B, 1, 1, S), from ``encoder_attention_mask``) follows per sample.

Keys and values (todo/auto) are reduced at ``dispatch_attention_fn``, after the rotary embedding and the
grouped-query repeat.
"""

from __future__ import annotations

import torch

from ..algorithms import TokenLayout
from ..notices import warn_at_caller
from . import Family
from .base import DECLINED, BlockLayout, Container, DenoiserLayout, Follow, IdsLayout, KeyValueSite, Span

ROTARY = Follow("image_rotary_emb", dim=0, stream="joint")
MASK = Follow("attention_mask", dim=-1, stream="joint")


def block(module: torch.nn.Module) -> BlockLayout:
    attn, ff = module.attn, module.ff
    spans = [
        Span("merge_attn", attn, attn, stream="joint", follows=((attn, ROTARY), (attn, MASK)), name="attn"),
        Span("merge_mlp", ff, ff, stream="joint", name="ff"),
    ]
    return BlockLayout(module, spans, [KeyValueSite(attn, stream="joint")], input_stream="joint", kind=type(module).__name__)


class Krea2Layout(IdsLayout):
    """[text; image]: the image grid from the rows of ``position_ids`` after the text's (:class:`IdsLayout`), the text
    length from the stacked text layers (B, T, layers, C)."""

    def __init__(self, root: torch.nn.Module) -> None:
        super().__init__(root, ("text", "image"), ids="position_ids")

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        ids, x, text = self.ids(args, kwargs), self.tokens(args, kwargs), self.text(args, kwargs)
        if not all(isinstance(t, torch.Tensor) for t in (ids, x, text)) or ids.ndim != 2 or x.ndim != 3 or text.ndim < 3:
            return None
        t = text.shape[1]
        grids = self.reads(ids, lambda ids: self._grids(ids[t:])) if ids.shape[0] == t + x.shape[1] else None
        if grids is None or len(grids) != 1:
            if not self.warned:
                self.warned = True
                warn_at_caller(
                    f"tokenmerge: Krea 2: the {x.shape[1]} image tokens' position_ids do not form one row-major grid; such calls run unchanged",
                )
            return DECLINED
        return TokenLayout.joint(self.order, grids[0], t)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [block(b) for b in getattr(module, "transformer_blocks", [])]
    return DenoiserLayout(module, [Container(module, blocks, 1, Krea2Layout(module))], "krea2", single_level=True) if blocks else None


FAMILY = Family(
    name="krea2",
    title="Krea 2",
    timesteps=(1.0, 0.0),  # the pipeline passes t / 1000
    classes=("Krea2Transformer2DModel",),
    layout=layout,
    pipelines=("Krea2Pipeline",),
    notes="grid: the image rows of position_ids (S, 3) after the text's, one host read per ids tensor; text: "
    "encoder_hidden_states (B, T, layers, C), first; rotary: (cos, sin) rows [text; image], no batch dimension, gathered "
    "at each sample's kept rows; the (B, 1, 1, S) attention_mask gathered per sample; text_fusion not patched",
)
