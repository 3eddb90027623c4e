"""Stable Diffusion 3 / 3.5 (MMDiT): ``JointTransformerBlock``s over [image; text].

The image stream is merged around the joint attention (``attn``, whose processor concatenates [image; text]),
SD3.5's image-only ``attn2`` and the MLP; the text stream runs as it is. Positions are added at the patch
embedding, so merged tokens need no position of their own; the image keys and values have projections of their
own (``to_k`` / ``to_v``), which run on downsampled tokens. Grid: the (B, C, H, W) latent over 2x2 patches.
"""

from __future__ import annotations

import torch

from . import Family
from .base import Argument, ComfyBlocks, ComfyModel, Container, DenoiserLayout, ImageGrid, config_int, joint_block


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [joint_block(b, image_attention="attn2", projections=True) for b in getattr(module, "transformer_blocks", [])]
    grid = ImageGrid(config_int(module, "patch_size", 2), Argument(module, "encoder_hidden_states"), ("image", "text"))
    return DenoiserLayout(module, [Container(module, blocks, 1, grid)], "sd3", single_level=True) if blocks else None


# 77 CLIP + 256 T5 text tokens at the pipeline's defaults.
FAMILY = Family(
    name="sd3",
    title="SD3 / SD3.5",
    classes=("SD3Transformer2DModel", "SD3ControlNetModel", "SD3MultiControlNetModel"),
    layout=layout,
    pipelines=("StableDiffusion3Pipeline", "StableDiffusion3ControlNetPipeline", "StableDiffusion3Img2ImgPipeline"),
    notes="grid: hidden_states (B, C, H, W) / patch_size; text: encoder_hidden_states, after the image in the joint attention; "
    "positions: absolute, added at the patch embedding",
    comfy=ComfyModel(
        ("OpenAISignatureMMDITWrapper", "MMDiT"),
        "SD3 / SD3.5",
        notes="comfy/ldm/modules/diffusionmodules/mmdit.py _block_mixing: q, k, v (B, S, H*D), [text (and register tokens); "
        "image]; SD3.5's extra image self-attention: image only; positions added to the tokens before the blocks",
        blocks=ComfyBlocks((("double_block", "joint_blocks"),)),  # "img": the image tokens alone, no rotary table
    ),
)
