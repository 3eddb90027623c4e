"""diffusers UNets (SD 1.x/2.x/XL, ControlNet, AnimateDiff, SVD, ...) and their transformers."""

from __future__ import annotations

import torch

from .base import SpatialContainer, has_class_named, transformer_blocks


def is_container(module: torch.nn.Module) -> bool:
    if has_class_named(module, "Transformer2DModel"):
        # Patched (DiT) and vectorized inputs do not see a (B, C, H, W) latent directly.
        return bool(getattr(module, "is_input_continuous", False))
    return has_class_named(module, "TransformerSpatioTemporalModel")


def is_denoiser(module: torch.nn.Module) -> bool:
    return has_class_named(module, "ModelMixin") and isinstance(getattr(module, "down_blocks", None), torch.nn.ModuleList)


def _containers_in(block: torch.nn.Module | None, level: int) -> list[SpatialContainer]:
    if block is None:
        return []
    return [SpatialContainer(m, transformer_blocks(m), level) for m in block.modules() if is_container(m)]


def containers(root: torch.nn.Module) -> list[SpatialContainer]:
    """Walk down, mid and up blocks in execution order, tracking the resolution level."""
    found: list[SpatialContainer] = []
    level = 1
    for block in root.down_blocks:
        found += _containers_in(block, level)
        if getattr(block, "downsamplers", None):
            level *= 2
    found += _containers_in(getattr(root, "mid_block", None), level)
    for block in getattr(root, "up_blocks", None) or []:
        found += _containers_in(block, level)
        if getattr(block, "upsamplers", None):
            level //= 2
    return found
