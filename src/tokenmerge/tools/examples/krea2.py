"""The examples of the krea2 family (tokenmerge.families.krea2): its published config, a tiny config and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int) -> dict[str, Any]:
    """The Krea 2 pipeline's call at a (height, width) latent: packed 2x2 patches, the stack of tapped text-encoder
    layers per token, padded in the middle of the template ([prompt | padding | suffix]: the one token before the last
    is padding here) and masked, and the (S, 3) position ids of [text (zeros); image (0, row, col)]."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    h, w = height // 2, width // 2
    text = torch.randn(batch, text_tokens, config.num_text_layers, config.text_hidden_dim, generator=g).to(dtype)
    mask = torch.ones(batch, text_tokens, dtype=torch.bool)
    if text_tokens > 2:
        mask[:, -2] = False
    image_ids = torch.zeros(h, w, 3)
    image_ids[..., 1] = torch.arange(h)[:, None]
    image_ids[..., 2] = torch.arange(w)[None, :]
    return {
        "hidden_states": torch.randn(batch, h * w, config.in_channels, generator=g).to(dtype),
        "encoder_hidden_states": text,
        "timestep": torch.full((batch,), 0.5, dtype=dtype),  # the pipeline passes t / 1000
        "position_ids": torch.cat([torch.zeros(text_tokens, 3), image_ids.reshape(h * w, 3)]),
        "encoder_attention_mask": mask,
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    """The first ``n`` blocks (the text fusion stays: it runs before them)."""
    return {**config, "num_layers": min(n, config["num_layers"])}


# The class defaults of diffusers 0.42.1 (its pipeline names no published checkpoint).
CONFIG = {
    "in_channels": 64,
    "num_layers": 28,
    "attention_head_dim": 128,
    "num_attention_heads": 48,
    "num_key_value_heads": 12,
    "intermediate_size": 16384,
    "timestep_embed_dim": 256,
    "text_hidden_dim": 2560,
    "num_text_layers": 12,
    "text_num_attention_heads": 20,
    "text_num_key_value_heads": 20,
    "text_intermediate_size": 6912,
    "num_layerwise_text_blocks": 2,
    "num_refiner_text_blocks": 2,
    "axes_dims_rope": (32, 48, 48),
    "rope_theta": 1000.0,
    "norm_eps": 1e-5,
}


# axes_dims_rope sums to the head size (asserted by the model); grouped-query attention kept (4 heads, 2 key/value heads).
SMALL = {
    "in_channels": 16,
    "num_layers": 2,
    "attention_head_dim": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 64,
    "timestep_embed_dim": 16,
    "text_hidden_dim": 16,
    "num_text_layers": 3,
    "text_num_attention_heads": 2,
    "text_num_key_value_heads": 2,
    "text_intermediate_size": 32,
    "num_layerwise_text_blocks": 1,
    "num_refiner_text_blocks": 1,
    "axes_dims_rope": (2, 2, 4),
}


# The pipeline pads the prompt to max_sequence_length (512) inside its template, then appends the template's suffix.
TEXT_TOKENS = 512


FAMILY = "krea2"
EXAMPLES = {"krea2": Example("Krea2Transformer2DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks)}
