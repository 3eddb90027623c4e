"""PRX (Photoroom; ``PRXTransformer2DModel``, latent and pixel-space): blocks whose image queries attend to
[text; image] keys.

``PRXBlock``: the image stream alone runs through each block; its attention (``attention``) projects the image's
queries, keys and values and the text's keys and values (the text is not updated: the same projected text reaches
every block), applies the rotary table to the image queries and keys, and attends the image queries to the
concatenated [text; image] keys. The image stream is merged around ``attention`` and from
``post_attention_layernorm``'s output to ``down_proj``'s (the gated MLP is inline in the block's forward: ``gate_proj``
and ``up_proj`` both read that output).

Token layout, read at the root without a host sync: the grid from ``hidden_states`` (B, C, H, W) over
``patch_size``; the text from ``encoder_hidden_states``, first among the keys, never reduced. The rotary table
(``image_rotary_emb``, (B, 1, N, D/2, 2, 2): image rows only) follows a merge per sample; the text mask
(``attention_mask``, (B, T)) covers the text alone and is widened by the processor over however many image tokens it
gets. Keys and values (todo/auto) are reduced at ``dispatch_attention_fn``, after the rotary embedding.
"""

from __future__ import annotations

import torch

from . import Family
from .base import Argument, BlockLayout, Container, DenoiserLayout, Follow, ImageGrid, KeyValueSite, Span, config_int

ROTARY = Follow("image_rotary_emb", dim=2, stream="image")


def block(module: torch.nn.Module) -> BlockLayout:
    attn = module.attention
    spans = [
        Span("merge_attn", attn, attn, follows=((attn, ROTARY),), name="attention"),
        Span("merge_mlp", module.post_attention_layernorm, module.down_proj, enter_on_output=True, name="mlp"),
    ]
    return BlockLayout(module, spans, [KeyValueSite(attn, stream="joint")], kind=type(module).__name__)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [block(b) for b in getattr(module, "blocks", [])]
    grid = ImageGrid(config_int(module, "patch_size", 2), Argument(module, "encoder_hidden_states"), ("text", "image"))
    return DenoiserLayout(module, [Container(module, blocks, 1, grid)], "prx", single_level=True) if blocks else None


FAMILY = Family(
    name="prx",
    title="PRX",
    timesteps=(1.0, 0.0),  # the pipelines pass t / 1000
    classes=("PRXTransformer2DModel",),
    layout=layout,
    pipelines=("PRXPipeline", "PRXPixelPipeline"),
    notes="grid: hidden_states (B, C, H, W) / patch_size; text: encoder_hidden_states, first among the keys (image "
    "queries only); rotary: image_rotary_emb (B, 1, N, D/2, 2, 2), image rows, gathered per sample; the text-only "
    "attention_mask needs no gathering",
)
