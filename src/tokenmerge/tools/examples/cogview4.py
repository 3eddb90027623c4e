"""The examples of the cogview4 family (tokenmerge.families.cogview4): its published config, a tiny config and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int) -> dict[str, Any]:
    """The CogView4 pipeline's call at a (height, width) latent: GLM text, the SDXL-style size conditions in px (original
    = target = the image's, no crop), one call per guidance branch, no mask, the rotary table left to the model."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    size = torch.tensor([[height * 8, width * 8]] * batch, dtype=dtype)
    return {
        "hidden_states": torch.randn(batch, config.in_channels, height, width, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.text_embed_dim, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500.0),
        "original_size": size,
        "target_size": size.clone(),
        "crop_coords": torch.zeros(batch, 2, dtype=dtype),
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_layers": min(n, config["num_layers"])}


# transformer/config.json of THUDM/CogView4-6B.
CONFIG = {
    "patch_size": 2,
    "in_channels": 16,
    "out_channels": 16,
    "num_layers": 28,
    "attention_head_dim": 128,
    "num_attention_heads": 32,
    "text_embed_dim": 4096,
    "time_embed_dim": 512,
    "condition_dim": 256,
    "pos_embed_max_size": 128,
    "sample_size": 128,
    "rope_axes_dim": (256, 256),
}


SMALL = {
    "in_channels": 4,
    "out_channels": 4,
    "num_layers": 2,
    "attention_head_dim": 8,
    "num_attention_heads": 2,
    "text_embed_dim": 16,
    "time_embed_dim": 8,
    "condition_dim": 4,
}


# The pipeline pads the GLM prompt (padding="longest") on the left to a multiple of 16: a prompt of about a hundred tokens.
TEXT_TOKENS = 128


FAMILY = "cogview4"
EXAMPLES = {"cogview4": Example("CogView4Transformer2DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks)}
