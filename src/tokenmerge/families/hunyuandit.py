"""Hunyuan-DiT (v1.0-v1.2, and the ControlNet pipeline's denoiser): a U-shaped DiT of self+cross blocks.

``HunyuanDiTBlock``: self-attention (``attn1``), cross-attention (``attn2``) to the joint text ([BERT; T5], 77 + 256
tokens) and MLP (``ff``), on the image tokens alone, each merged around itself. The blocks of the second half first
join a skip connection from the first half (concatenated channels, a linear layer), before their spans: it is per
token, whole. The 2-D rotary table is applied to the queries of both attentions (and the self-attention's keys), so
it follows the merge of ``attn1`` and of ``attn2``.

Token layout, read at the root without a host sync:

- grid: ``hidden_states`` (B, C, H, W) over ``patch_size``: an (h, w) grid, row-major.
- text: cross-attention only (``attn2``), never reduced.
- rotary: ``image_rotary_emb = (cos, sin)``, each (N, D), computed by the pipeline: no batch dimension; gathered at
  each sample's kept rows.

Keys and values (todo/auto) are reduced at SDPA in ``attn1``, after the rotary embedding.
"""

from __future__ import annotations

import torch

from . import Family
from .base import BlockLayout, Container, DenoiserLayout, Follow, ImageGrid, KeyValueSite, Span, config_int

ROTARY = Follow("image_rotary_emb", dim=0, stream="image")


def block(module: torch.nn.Module) -> BlockLayout:
    """attn1, attn2 and ff, each a span; the rotary table follows both attentions (it rotates attn2's queries too)."""
    attn1, attn2, ff = module.attn1, module.attn2, module.ff
    spans = [
        Span("merge_attn", attn1, attn1, follows=((attn1, ROTARY),), name="attn1"),
        Span("merge_crossattn", attn2, attn2, follows=((attn2, ROTARY),), name="attn2"),
        Span("merge_mlp", ff, ff, name="ff"),
    ]
    return BlockLayout(module, spans, [KeyValueSite(attn1)], kind=type(module).__name__)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [block(b) for b in getattr(module, "blocks", []) if isinstance(getattr(b, "attn1", None), torch.nn.Module)]
    if not blocks:
        return None
    grid = ImageGrid(config_int(module, "patch_size", 2))
    return DenoiserLayout(module, [Container(module, blocks, 1, grid)], "hunyuandit", single_level=True)


FAMILY = Family(
    name="hunyuandit",
    title="Hunyuan-DiT",
    classes=("HunyuanDiT2DModel",),
    layout=layout,
    pipelines=("HunyuanDiTPipeline", "HunyuanDiTControlNetPipeline"),
    cross_attention=True,
    notes="grid: hidden_states (B, C, H, W) / patch_size; text ([BERT; T5]): cross-attention (attn2) only; rotary: "
    "image_rotary_emb (cos, sin), each (N, D), gathered at each sample's kept rows in attn1 and attn2 (queries)",
)
