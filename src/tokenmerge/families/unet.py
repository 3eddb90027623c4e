"""diffusers UNets (SD 1.x/2.x/XL, ControlNet, AnimateDiff, SVD, ...) and their spatial transformers.

Too many classes to list (every UNet, ControlNet and motion model of diffusers): recognised by structure, a
diffusers model with ``down_blocks``. Each spatial transformer is a container whose (B, C, H, W) input gives the
grid of its blocks; levels are tracked through the down- and upsamplers."""

from __future__ import annotations

import torch

from . import Family
from .base import Container, DenoiserLayout, basic_block, containers_in, has_class_named


def is_container(module: torch.nn.Module) -> bool:
    if has_class_named(module, "Transformer2DModel"):
        # Patched (DiT) and vectorized inputs do not see a (B, C, H, W) latent directly.
        return bool(getattr(module, "is_input_continuous", False))
    return has_class_named(module, "TransformerSpatioTemporalModel")


def is_unet(module: torch.nn.Module) -> bool:
    return has_class_named(module, "ModelMixin") and isinstance(getattr(module, "down_blocks", None), torch.nn.ModuleList)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    """The layout of a diffusers UNet (anything with ``down_blocks``): down, mid and up blocks in execution
    order, the resolution level tracked through the down- and upsamplers."""
    if not is_unet(module):
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
    return DenoiserLayout(module, found, "diffusers-unet") if found else None


FAMILY = Family(
    px=(8, 0),  # grids of the latent (SD's VAE: 8 px per cell)
    name="diffusers-unet",
    title="SD 1.x / 2.x / XL UNet (diffusers)",
    kind="unet",
    matches=is_unet,
    layout=layout,
    pipelines=("StableDiffusionPipeline", "StableDiffusionXLPipeline", "StableDiffusionControlNetPipeline", "AnimateDiffPipeline"),
    members=("UNet2DConditionModel", "ControlNetModel", "UNetMotionModel", "UNetSpatioTemporalConditionModel"),
    cross_attention=True,
    notes="grid: each spatial transformer's (B, C, H, W) input; text: cross-attention only (never merged by default)",
)
