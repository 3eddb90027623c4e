"""The examples of the ltx family (tokenmerge.families.ltx): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

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
    """The LTX pipelines' call at a (frames, height, width) latent: packed tokens, T5 text with its mask, guidance
    as one batch; ``condition_frame``: image-to-video's per-token timestep, 0 on the first latent frame."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    n = frames * height * width
    timestep = torch.full((batch,), 500.0)
    if condition_frame:
        timestep = clean_first_frame(batch, n, height * width, 500.0)
    return {
        "hidden_states": torch.randn(batch, n, config.in_channels, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.caption_channels, generator=g).to(dtype),
        "timestep": timestep,
        "encoder_attention_mask": torch.ones(batch, text_tokens, dtype=torch.long),
        "num_frames": frames,
        "height": height,
        "width": width,
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_layers": min(n, config["num_layers"])}


# The class's defaults: Lightricks/LTX-Video 0.9's transformer (2B; 32x spatial, 8x temporal VAE).
CONFIG: dict[str, Any] = {"num_layers": 28}


SMALL = {
    "in_channels": 8,
    "out_channels": 8,
    "num_attention_heads": 2,
    "attention_head_dim": 8,
    "cross_attention_dim": 16,
    "num_layers": 2,
    "caption_channels": 16,
}


TEXT_TOKENS = 128  # the pipelines' max_sequence_length


FAMILY = "ltx"
EXAMPLES = {
    "ltx": Example(
        "LTXVideoTransformer3DModel",
        CONFIG,
        SMALL,
        inputs,
        TEXT_TOKENS,
        first_blocks,
        None,
        1,
        frames=21,
        vae_factor=32,
        frame_factor=8,
    ),
    "ltx-i2v": Example(
        "LTXVideoTransformer3DModel",
        CONFIG,
        SMALL,
        partial(inputs, condition_frame=True),
        TEXT_TOKENS,
        first_blocks,
        None,
        1,
        frames=21,
        vae_factor=32,
        frame_factor=8,
    ),
}


# ComfyUI's own implementation at a tiny width (and the published one, where the ComfyUI bench runs it).
COMFY = ComfyExample(
    supported="LTXV",
    unet_config={
        "image_model": "ltxv",
        "num_layers": 1,
        "attention_head_dim": 16,
        "num_attention_heads": 2,
        "cross_attention_dim": 32,
        "in_channels": 128,
        "caption_channels": 32,
    },
    context=32,
    pooled=0,
    channels=128,
    video=True,
    caption_mask=True,  # its text encoders hand over the caption's mask too
    downscale=32,
)
