"""The examples of the latte family (tokenmerge.families.latte): its published config, tiny config and its pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example


def inputs(
    model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int, frames: int | None = None
) -> dict[str, Any]:
    """The Latte pipeline's call at a (frames, height, width) latent (default: the model's ``video_length``, the only
    frame count its temporal position table adds to): T5 text, classifier-free guidance as one batch."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    frames = config.video_length if frames is None else frames
    return {
        "hidden_states": torch.randn(batch, config.in_channels, frames, height, width, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.caption_channels, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500, dtype=torch.long),
        "enable_temporal_attentions": True,
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_layers": min(n, config["num_layers"])}


# transformer/config.json of maxin-cn/Latte-1 (from memory of the published repo: PixArt-α's widths, learned sigma).
CONFIG = {
    "activation_fn": "gelu-approximate",
    "attention_bias": True,
    "attention_head_dim": 72,
    "caption_channels": 4096,
    "cross_attention_dim": 1152,
    "dropout": 0.0,
    "in_channels": 4,
    "norm_elementwise_affine": False,
    "norm_eps": 1e-6,
    "norm_type": "ada_norm_single",
    "num_attention_heads": 16,
    "num_embeds_ada_norm": 1000,
    "num_layers": 28,
    "out_channels": 8,
    "patch_size": 2,
    "sample_size": 64,
    "video_length": 16,
}


SMALL = {
    "num_layers": 2,
    "attention_head_dim": 8,
    "num_attention_heads": 2,
    "cross_attention_dim": 16,
    "caption_channels": 16,
    "video_length": 3,
}


TEXT_TOKENS = 120  # the pipeline's max_sequence_length (T5), before mask_feature trims the padding


FAMILY = "latte"
# 16 frames at 512x512 px: the pipeline's default (SD's image VAE, frame by frame: one latent frame per frame).
EXAMPLES = {"latte": Example("LatteTransformer3DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks, frames=16, frame_factor=1)}
