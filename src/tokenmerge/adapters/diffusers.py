"""diffusers UNets (SD 1.x/2.x/XL, ControlNet, AnimateDiff, SVD, ...) and their transformers."""

from __future__ import annotations

import torch

from .base import SpatialContainer, containers_in, has_class_named


def is_container(module: torch.nn.Module) -> bool:
    if has_class_named(module, "Transformer2DModel"):
        # Patched (DiT) and vectorized inputs do not see a (B, C, H, W) latent directly.
        return bool(getattr(module, "is_input_continuous", False))
    return has_class_named(module, "TransformerSpatioTemporalModel")


def is_denoiser(module: torch.nn.Module) -> bool:
    return has_class_named(module, "ModelMixin") and isinstance(getattr(module, "down_blocks", None), torch.nn.ModuleList)


def containers(root: torch.nn.Module) -> list[SpatialContainer]:
    """Walk down, mid and up blocks in execution order, tracking the resolution level."""
    found: list[SpatialContainer] = []
    level = 1
    for block in root.down_blocks:
        found += containers_in(block, level, is_container)
        if getattr(block, "downsamplers", None):
            level *= 2
    found += containers_in(getattr(root, "mid_block", None), level, is_container)
    for block in getattr(root, "up_blocks", None) or []:
        found += containers_in(block, level, is_container)
        if getattr(block, "upsamplers", None):
            level //= 2
    return found
