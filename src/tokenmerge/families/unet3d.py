"""ModelScope text-to-video and ZeroScope (``UNet3DConditionModel``): an SD UNet with temporal layers.

Its cross-attention down and up blocks and its mid block hold, per layer, a spatial ``Transformer2DModel`` and a
temporal ``TransformerTemporalModel``. The spatial transformers see each frame as an image ((B * F, C, H, W), the
prompt repeated per frame): containers as in :mod:`.unet`, their grids read per frame, levels tracked through the
down- and upsamplers. The temporal transformers attend along the frames at each pixel (sequences of F tokens, with no
spatial grid to match in): left whole, as are its ``transformer_in`` and temporal convolutions.
"""

from __future__ import annotations

import dataclasses

import torch

from . import Family
from .base import DenoiserLayout
from .unet import layout as unet_layout


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    found = unet_layout(module)
    return None if found is None else dataclasses.replace(found, family="unet3d")


FAMILY = Family(
    px=(8, 0),  # grids of each frame's latent
    name="unet3d",
    title="ModelScope / ZeroScope UNet3D",
    kind="unet",
    classes=("UNet3DConditionModel",),
    layout=layout,
    pipelines=("TextToVideoSDPipeline", "VideoToVideoSDPipeline"),
    cross_attention=True,
    notes="grid: each spatial transformer's (B * F, C, H, W) input, one frame per image; temporal transformers "
    "(sequences of frames) left whole; text: cross-attention only (never merged by default)",
)
