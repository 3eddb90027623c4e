"""The original latent-diffusion code: ``ldm`` (SD 1.x/2.x, as the webui runs it) and ``sgm`` (SDXL)."""

from __future__ import annotations

import torch

from .base import SpatialContainer, containers_in, has_class_named


def is_container(module: torch.nn.Module) -> bool:
    return has_class_named(module, "SpatialTransformer")  # also sgm's SpatialVideoTransformer


def is_denoiser(module: torch.nn.Module) -> bool:
    return all(isinstance(getattr(module, name, None), torch.nn.Module) for name in ("input_blocks", "middle_block", "output_blocks"))


def _has_module_named(block: torch.nn.Module, name: str) -> bool:
    return any(type(m).__name__ == name for m in block.modules())


def containers(root: torch.nn.Module) -> list[SpatialContainer]:
    """Walk input, middle and output blocks in execution order, tracking the resolution level."""
    found: list[SpatialContainer] = []
    level = 1
    for block in root.input_blocks:
        found += containers_in(block, level, is_container)
        if _has_module_named(block, "Downsample"):
            level *= 2
    found += containers_in(root.middle_block, level, is_container)
    for block in root.output_blocks:
        found += containers_in(block, level, is_container)
        if _has_module_named(block, "Upsample"):
            level //= 2
    return found
