"""Stable Diffusion 3 / 3.5 (MMDiT): ``JointTransformerBlock``s over [image; text].

The image stream is merged around the joint attention (``attn``, whose processor concatenates [image; text]),
SD3.5's image-only ``attn2`` and the MLP; the text stream runs as it is. Positions are added at the patch
embedding, so merged tokens need no position of their own; the image keys and values have projections of their
own (``to_k`` / ``to_v``), which run on downsampled tokens. Grid: the (B, C, H, W) latent over 2x2 patches.
"""

from __future__ import annotations

from typing import Any

import torch

from . import Example, Family
from .base import Argument, ComfyModel, Container, DenoiserLayout, ImageGrid, config_int, joint_block


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [joint_block(b, image_attention="attn2", projections=True) for b in getattr(module, "transformer_blocks", [])]
    grid = ImageGrid(config_int(module, "patch_size", 2), Argument(module, "encoder_hidden_states"), ("image", "text"))
    return DenoiserLayout(module, [Container(module, blocks, 1, grid)], "sd3", single_level=True) if blocks else None


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int) -> dict[str, Any]:
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    return {
        "hidden_states": torch.randn(batch, config.in_channels, height, width, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.joint_attention_dim, generator=g).to(dtype),
        "pooled_projections": torch.randn(batch, config.pooled_projection_dim, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500.0),
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    config = {**config, "num_layers": min(n, config["num_layers"])}
    if "dual_attention_layers" in config:
        config["dual_attention_layers"] = tuple(i for i in config["dual_attention_layers"] if i < config["num_layers"])
    return config


# transformer/config.json of stabilityai/stable-diffusion-3-medium and -3.5-medium.
SD3 = {
    "sample_size": 128,
    "patch_size": 2,
    "in_channels": 16,
    "num_layers": 24,
    "attention_head_dim": 64,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "caption_projection_dim": 1536,
    "pooled_projection_dim": 2048,
    "out_channels": 16,
    "pos_embed_max_size": 192,
}
SD35 = {**SD3, "pos_embed_max_size": 384, "qk_norm": "rms_norm", "dual_attention_layers": tuple(range(13))}
SMALL = {"num_layers": 2, "attention_head_dim": 8, "num_attention_heads": 2, "joint_attention_dim": 16, "caption_projection_dim": 16}
SMALL = {**SMALL, "pooled_projection_dim": 8}
# 77 CLIP + 256 T5 text tokens at the pipeline's defaults.
FAMILY = Family(
    name="sd3",
    title="SD3 / SD3.5",
    classes=("SD3Transformer2DModel", "SD3ControlNetModel", "SD3MultiControlNetModel"),
    layout=layout,
    pipelines=("StableDiffusion3Pipeline", "StableDiffusion3ControlNetPipeline", "StableDiffusion3Img2ImgPipeline"),
    examples={
        "sd3": Example("SD3Transformer2DModel", SD3, SMALL, inputs, 333, first_blocks),
        "sd35": Example("SD3Transformer2DModel", SD35, {**SMALL, "dual_attention_layers": (0,)}, inputs, 333, first_blocks),
    },
    notes="grid: hidden_states (B, C, H, W) / patch_size; text: encoder_hidden_states, after the image in the joint attention; "
    "positions: absolute, added at the patch embedding",
    comfy=ComfyModel(
        ("OpenAISignatureMMDITWrapper", "MMDiT"),
        "SD3 / SD3.5",
        notes="comfy/ldm/modules/diffusionmodules/mmdit.py _block_mixing: q, k, v (B, S, H*D), [text (and register tokens); "
        "image]; SD3.5's extra image self-attention: image only; positions added to the tokens before the blocks",
    ),
)
