"""The examples of the wan family (tokenmerge.families.wan): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import torch

from . import ComfyExample, Example, clean_first_frame


def inputs(
    model: torch.nn.Module,
    height: int,
    width: int,
    batch: int,
    seed: int,
    text_tokens: int,
    frames: int = 3,
    condition_frame: bool = False,
) -> dict[str, Any]:
    """The Wan pipelines' call at a (frames, height, width) latent: umT5 text padded to its length; I2V models get
    the CLIP image tokens (257) and 20 extra channels (mask and image latent); TI2V a per-token timestep whose first
    frame is 0 (``condition_frame``: image-to-video); VACE its control latent (96 channels)."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    if config.image_dim is not None:
        text_tokens = TEXT_TOKENS  # the I2V processor takes whatever precedes the last 512 context tokens as CLIP's
    found: dict[str, Any] = {
        "hidden_states": torch.randn(batch, config.in_channels, frames, height, width, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500.0),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.text_dim, generator=g).to(dtype),
        "return_dict": False,
    }
    if config.image_dim is not None:
        found["encoder_hidden_states_image"] = torch.randn(batch, 257, config.image_dim, generator=g).to(dtype)
    if "vace_in_channels" in config:
        found["control_hidden_states"] = torch.randn(batch, config.vace_in_channels, frames, height, width, generator=g).to(dtype)
    if condition_frame:
        pt, ph, pw = config.patch_size
        per_frame = (height // ph) * (width // pw)
        found["timestep"] = clean_first_frame(batch, (frames // pt) * per_frame, per_frame, 500.0)
    return found


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    found = {**config, "num_layers": min(n, config["num_layers"])}
    if "vace_layers" in config:
        found["vace_layers"] = [i for i in config["vace_layers"] if i < found["num_layers"]]
    return found


# transformer/config.json of Wan-AI/Wan2.1-T2V-1.3B-Diffusers (14B: 40 heads, ffn 13824, 40 layers; Wan 2.2 A14B:
# two such experts, transformer and transformer_2).
CONFIG = {
    "patch_size": (1, 2, 2),
    "num_attention_heads": 12,
    "attention_head_dim": 128,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": 4096,
    "freq_dim": 256,
    "ffn_dim": 8960,
    "num_layers": 30,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6,
    "image_dim": None,
    "added_kv_proj_dim": None,
    "rope_max_seq_len": 1024,
}


# Wan-AI/Wan2.1-I2V-14B-480P-Diffusers: the image latent and mask as 20 more channels, CLIP ViT-H image tokens.
I2V = {
    **CONFIG,
    "num_attention_heads": 40,
    "ffn_dim": 13824,
    "num_layers": 40,
    "in_channels": 36,
    "image_dim": 1280,
    "added_kv_proj_dim": 5120,
}


# Wan-AI/Wan2.2-TI2V-5B-Diffusers (its VAE compresses 16x spatially: 48 latent channels).
TI2V = {**CONFIG, "num_attention_heads": 24, "ffn_dim": 14336, "in_channels": 48, "out_channels": 48}


# Wan-AI/Wan2.1-VACE-1.3B-diffusers.
VACE = {**CONFIG, "vace_layers": list(range(0, 30, 2)), "vace_in_channels": 96}


SMALL = {"num_attention_heads": 2, "attention_head_dim": 12, "text_dim": 16, "ffn_dim": 32, "num_layers": 2, "rope_max_seq_len": 32}


SMALL_I2V = {**SMALL, "in_channels": 8, "out_channels": 4, "image_dim": 16, "added_kv_proj_dim": 24}


SMALL_TI2V = {**SMALL, "in_channels": 48, "out_channels": 48}


SMALL_VACE = {**SMALL, "vace_layers": [0], "vace_in_channels": 8}


# umT5's prompt is padded to 512 tokens (and the I2V processor counts the CLIP tokens as what precedes them).
TEXT_TOKENS = 512


# 81 frames (4x temporal VAE: 21 latent frames) at 480x832 px: the pipelines' default.
FRAMES = 21


FAMILY = "wan"
EXAMPLES = {
    "wan": Example("WanTransformer3DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks, frames=FRAMES),
    "wan-i2v": Example("WanTransformer3DModel", I2V, SMALL_I2V, inputs, TEXT_TOKENS, first_blocks, frames=FRAMES),
    "wan-ti2v": Example(
        "WanTransformer3DModel",
        TI2V,
        SMALL_TI2V,
        partial(inputs, condition_frame=True),
        TEXT_TOKENS,
        first_blocks,
        frames=FRAMES,
        vae_factor=16,
    ),
    "wan-vace": Example("WanVACETransformer3DModel", VACE, SMALL_VACE, inputs, TEXT_TOKENS, first_blocks, frames=FRAMES),
}


# ComfyUI's own implementation at a tiny width (and the published one, where the ComfyUI bench runs it).
COMFY = ComfyExample(
    supported="WAN21_T2V",
    unet_config={
        "image_model": "wan2.1",
        "model_type": "t2v",
        "dim": 64,
        "out_dim": 16,
        "num_heads": 2,
        "ffn_dim": 128,
        "num_layers": 2,
        "patch_size": (1, 2, 2),
        "freq_dim": 256,
        "window_size": (-1, -1),
        "qk_norm": True,
        "cross_attn_norm": True,
        "eps": 1e-6,
        "in_dim": 16,
        "text_dim": 32,
    },
    context=32,
    pooled=0,
    channels=16,
    video=True,
    full={"dim": 1536, "num_heads": 12, "ffn_dim": 8960, "text_dim": 4096},
    full_context=4096,
    full_pooled=0,
    blocks={"num_layers": 1},
)

# Wan 2.2 TI2V 5B in ComfyUI (WAN22_T2V: 48 latent channels of its 16x VAE, per-token timesteps where an image is given).
COMFY_MORE = {
    "wan-ti2v": dataclasses.replace(
        COMFY,
        supported="WAN22_T2V",
        unet_config={**COMFY.unet_config, "in_dim": 48, "out_dim": 48},
        channels=48,
        full={"dim": 3072, "num_heads": 24, "ffn_dim": 14336, "text_dim": 4096},
        downscale=16,
    )
}
