"""ControlNet-XS (``UNetControlNetXSModel``): an SD / SDXL UNet fused with its ControlNet-XS adapter, block by block.

Each of its down blocks runs the base UNet's resnets and spatial transformers (``base_attentions``) beside the
adapter's (``ctrl_attentions``), on two streams of the same resolution that exchange features through zero convs;
the mid block holds a base and a control ``UNetMidBlock2DCrossAttn``; the up blocks are the base UNet's, fed the
control stream's skips. Every spatial transformer is a container as in :mod:`.unet` (its (B, C, H, W) input gives
the grid), both streams' alike. The structural test of :mod:`.unet` would claim it too, but would miss its levels:
its down blocks downsample through ``base_downsamplers`` / ``ctrl_downsamplers``, tracked here.
"""

from __future__ import annotations

import torch

from . import Family
from .base import Container, DenoiserLayout, basic_block, containers_in
from .unet import is_container


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    found: list[Container] = []
    level = 1
    for block in module.down_blocks:
        found += containers_in(block, level, is_container, basic_block)
        if getattr(block, "base_downsamplers", None) is not None:
            level *= 2
    found += containers_in(module.mid_block, level, is_container, basic_block)
    for block in module.up_blocks:
        found += containers_in(block, level, is_container, basic_block)
        if getattr(block, "upsamplers", None) is not None:
            level //= 2
    return DenoiserLayout(module, found, "controlnet-xs") if found else None


FAMILY = Family(
    px=(8, 0),
    name="controlnet-xs",
    title="ControlNet-XS (SD / SDXL UNet)",
    kind="unet",
    classes=("UNetControlNetXSModel",),
    layout=layout,
    pipelines=("StableDiffusionControlNetXSPipeline", "StableDiffusionXLControlNetXSPipeline"),
    cross_attention=True,
    notes="grid: each spatial transformer's (B, C, H, W) input, the base UNet's and the adapter's; levels through "
    "base_downsamplers and upsamplers; text: cross-attention only (never merged by default)",
)
