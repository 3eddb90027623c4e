"""CogView4 (CogView4-6B; text-to-image, control): joint-attention DiT blocks over [text; image].

``CogView4TransformerBlock``: one joint attention (``attn1``) takes the image and the text separately; its processor
concatenates [text; image], applies the 2-D rotary table to the image rows of the queries and keys, calls torch's
SDPA and returns ``(image, text)``. The one MLP (``ff``) is then called twice, on the image stream and on the text
stream, so a merge cannot start at its input (its text call would look like a chunk of the image stream): the image
stream is merged around ``attn1`` and from the image's ``norm2`` output (its text has ``norm2_context``) to ``ff``'s
output, which the image call leaves first.

Token layout, read at the root:

- grid: ``hidden_states`` (B, C, H, W) over ``patch_size`` (the control pipeline concatenates its control latent by
  channels: every token is generated).
- text: ``encoder_hidden_states`` (GLM tokens, padded on the left to a multiple of 16), first in the joint
  sequence, never reduced.
- rotary: ``image_rotary_emb = (cos, sin)``, each (N, D), computed by the root from the latent (or passed): image
  rows only, no batch dimension; gathered at each sample's kept rows.
- mask: ``attention_mask`` (B, T) covers the text only (the pipelines pass none); the processor widens it with ones
  over however many image tokens it is handed, so it needs no gathering, and its (B, 1, S, S) form follows
  downsampled keys at SDPA (nearest interpolations).

Keys and values (todo/auto) are reduced at SDPA, after the rotary embedding.
"""

from __future__ import annotations

import torch

from . import Family
from .base import Argument, BlockLayout, Container, DenoiserLayout, Follow, ImageGrid, KeyValueSite, Span, config_int

ROTARY = Follow("image_rotary_emb", dim=0, stream="image")


def block(module: torch.nn.Module) -> BlockLayout:
    attn, norm, ff = module.attn1, module.norm2, module.ff
    spans = [
        Span("merge_attn", attn, attn, leave_index=0, follows=((attn, ROTARY),), name="attn1"),
        Span("merge_mlp", norm, ff, enter_on_output=True, name="norm2+ff"),
    ]
    return BlockLayout(module, spans, [KeyValueSite(attn, stream="joint")], kind=type(module).__name__)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [block(b) for b in getattr(module, "transformer_blocks", [])]
    grid = ImageGrid(config_int(module, "patch_size", 2), Argument(module, "encoder_hidden_states"), ("text", "image"))
    return DenoiserLayout(module, [Container(module, blocks, 1, grid)], "cogview4", single_level=True) if blocks else None


FAMILY = Family(
    name="cogview4",
    title="CogView4",
    classes=("CogView4Transformer2DModel",),
    layout=layout,
    pipelines=("CogView4Pipeline", "CogView4ControlPipeline"),
    notes="grid: hidden_states (B, C, H, W) / patch_size; text: encoder_hidden_states, first in the joint sequence; "
    "rotary: image_rotary_emb (cos, sin), image rows, gathered at each sample's kept rows; the text-only attention_mask "
    "needs no gathering",
)
