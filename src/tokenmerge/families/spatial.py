"""A diffusers ``Transformer2DModel`` on its own (outside a UNet): a spatial transformer over a latent, or a patch
transformer (DiT-style, ``is_input_patches``); also ``TransformerSpatioTemporalModel``."""

from __future__ import annotations

import torch

from . import Family
from .base import Container, DenoiserLayout, ImageGrid, basic_block, config_int, has_class_named, spatial_blocks
from .unet import is_container


def matches(module: torch.nn.Module) -> bool:
    return has_class_named(module, "Transformer2DModel", "TransformerSpatioTemporalModel")


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    if is_container(module):
        blocks = [basic_block(b) for b in spatial_blocks(module)]
        grid, single = ImageGrid(), False
    elif getattr(module, "is_input_patches", False):
        blocks = [basic_block(b) for b in getattr(module, "transformer_blocks", []) if has_class_named(b, "BasicTransformerBlock")]
        grid, single = ImageGrid(config_int(module, "patch_size", 2)), True
    else:
        return None
    return DenoiserLayout(module, [Container(module, blocks, 1, grid)], "diffusers-spatial", single_level=single) if blocks else None


FAMILY = Family(
    name="diffusers-spatial",
    title="Transformer2DModel (diffusers)",
    kind="unet",
    matches=matches,
    layout=layout,
    members=("Transformer2DModel", "TransformerSpatioTemporalModel"),
    cross_attention=True,
    notes="grid: the (B, C, H, W) input (over patches when is_input_patches)",
)
