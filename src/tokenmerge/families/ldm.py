"""The original latent-diffusion code: ``ldm`` (SD 1.x/2.x, as the webui runs it) and ``sgm`` (SDXL)."""

from __future__ import annotations

import torch

from . import Family
from .base import BlockLayout, DenoiserLayout, basic_block, containers_in, has_class_named


def is_container(module: torch.nn.Module) -> bool:
    return has_class_named(module, "SpatialTransformer")  # also sgm's SpatialVideoTransformer


def is_unet(module: torch.nn.Module) -> bool:
    return all(isinstance(getattr(module, name, None), torch.nn.Module) for name in ("input_blocks", "middle_block", "output_blocks"))


def _has_module_named(block: torch.nn.Module, name: str) -> bool:
    return any(type(m).__name__ == name for m in block.modules())


def _block(module: torch.nn.Module) -> BlockLayout:
    # ldm/sgm blocks checkpoint their own ``_forward``; its backward re-runs it without the block's hooks.
    return basic_block(module, recompute_method="_forward" if callable(getattr(type(module), "_forward", None)) else None)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    """Input, middle and output blocks in execution order, the resolution level tracked through the samplers."""
    if not is_unet(module):
        return None
    found = []
    level = 1
    for block in module.input_blocks:
        found += containers_in(block, level, is_container, _block)
        if _has_module_named(block, "Downsample"):
            level *= 2
    found += containers_in(module.middle_block, level, is_container, _block)
    for block in module.output_blocks:
        found += containers_in(block, level, is_container, _block)
        if _has_module_named(block, "Upsample"):
            level //= 2
    return DenoiserLayout(module, found, "ldm") if found else None


FAMILY = Family(
    px=(8, 0),  # grids of the latent (SD's VAE: 8 px per cell)
    name="ldm",
    title="ldm / sgm UNet (webui, Forge, ComfyUI)",
    kind="unet",
    matches=is_unet,
    layout=layout,
    front_ends=("webui", "forge", "comfyui"),
    members=("ldm UNetModel", "sgm UNetModel"),
    cross_attention=True,
    notes="grid: each SpatialTransformer's (B, C, H, W) input; text: cross-attention only",
)
