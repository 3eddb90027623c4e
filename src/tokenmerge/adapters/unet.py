"""diffusers UNets (SD 1.x/2.x/XL, ControlNet, AnimateDiff, SVD, ...) and their spatial transformers."""

from __future__ import annotations

import torch

from .base import Container, DenoiserLayout, ImageGrid, basic_block, containers_in, has_class_named, spatial_blocks


def is_container(module: torch.nn.Module) -> bool:
    if has_class_named(module, "Transformer2DModel"):
        # Patched (DiT) and vectorized inputs do not see a (B, C, H, W) latent directly.
        return bool(getattr(module, "is_input_continuous", False))
    return has_class_named(module, "TransformerSpatioTemporalModel")


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    """The layout of a diffusers UNet (anything with ``down_blocks``): down, mid and up blocks in execution
    order, the resolution level tracked through the down- and upsamplers."""
    if not (has_class_named(module, "ModelMixin") and isinstance(getattr(module, "down_blocks", None), torch.nn.ModuleList)):
        return None
    found: list[Container] = []
    level = 1
    for block in module.down_blocks:
        found += containers_in(block, level, is_container, basic_block)
        if getattr(block, "downsamplers", None):
            level *= 2
    found += containers_in(getattr(module, "mid_block", None), level, is_container, basic_block)
    for block in getattr(module, "up_blocks", None) or []:
        found += containers_in(block, level, is_container, basic_block)
        if getattr(block, "upsamplers", None):
            level //= 2
    return DenoiserLayout(module, found, "diffusers UNet") if found else None


def loose_container(module: torch.nn.Module) -> DenoiserLayout | None:
    """A spatial transformer outside any UNet (a bare ``Transformer2DModel``): one container at level 1."""
    if not is_container(module):
        return None
    blocks = [basic_block(b) for b in spatial_blocks(module)]
    return DenoiserLayout(module, [Container(module, blocks, 1, ImageGrid())], "diffusers spatial transformer") if blocks else None
