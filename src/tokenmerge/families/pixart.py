"""PixArt-α/Σ and DiT: ``BasicTransformerBlock``s over the patch tokens, as in a UNet's spatial transformer
(self-attention, cross-attention to the text, MLP). Grid: the (B, C, H, W) latent over its patches."""

from __future__ import annotations

import torch

from . import Family
from .base import Container, DenoiserLayout, ImageGrid, basic_block, config_int, has_class_named


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [basic_block(b) for b in getattr(module, "transformer_blocks", []) if has_class_named(b, "BasicTransformerBlock")]
    grid = ImageGrid(config_int(module, "patch_size", 2))
    return DenoiserLayout(module, [Container(module, blocks, 1, grid)], "pixart", single_level=True) if blocks else None


FAMILY = Family(
    name="pixart",
    title="PixArt-α/Σ, DiT",
    classes=("PixArtTransformer2DModel", "DiTTransformer2DModel"),
    layout=layout,
    pipelines=("PixArtAlphaPipeline", "PixArtSigmaPipeline", "DiTPipeline"),
    cross_attention=True,
    notes="grid: hidden_states (B, C, H, W) / patch_size; text: cross-attention (attn2) only",
)
