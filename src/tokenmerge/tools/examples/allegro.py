"""The examples of the allegro family (tokenmerge.families.allegro): its published config, tiny config and its pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int, frames: int = 3) -> dict[str, Any]:
    """The Allegro pipeline's call at a (frames, height, width) latent: T5 text with its mask, the pipeline's 3-D
    rotary tables and position rows, classifier-free guidance as one batch."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed_allegro

    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    gh, gw = height // config.patch_size, width // config.patch_size
    scale = (config.interpolation_scale_t, config.interpolation_scale_h, config.interpolation_scale_w)
    *tables, grid_t, grid_h, grid_w = get_3d_rotary_pos_embed_allegro(
        config.attention_head_dim, ((0, 0), (gh, gw)), (gh, gw), frames, scale
    )
    positions = torch.cartesian_prod(grid_t.long(), grid_h.long(), grid_w.long()).reshape(-1, 3).transpose(0, 1).reshape(3, 1, -1)
    return {
        "hidden_states": torch.randn(batch, config.in_channels, frames, height, width, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.caption_channels, generator=g).to(dtype),
        "encoder_attention_mask": torch.ones(batch, text_tokens, dtype=torch.long),
        "timestep": torch.full((batch,), 500, dtype=torch.long),
        "image_rotary_emb": (tuple(tables), tuple(positions.contiguous())),
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_layers": min(n, config["num_layers"])}


# transformer/config.json of rhymes-ai/Allegro: the class defaults.
CONFIG = {
    "patch_size": 2,
    "patch_size_t": 1,
    "num_attention_heads": 24,
    "attention_head_dim": 96,
    "in_channels": 4,
    "out_channels": 4,
    "num_layers": 32,
    "cross_attention_dim": 2304,
    "attention_bias": True,
    "sample_height": 90,
    "sample_width": 160,
    "sample_frames": 22,
    "activation_fn": "gelu-approximate",
    "norm_elementwise_affine": False,
    "norm_eps": 1e-6,
    "caption_channels": 4096,
    "interpolation_scale_h": 2.0,
    "interpolation_scale_w": 2.0,
    "interpolation_scale_t": 2.2,
}


SMALL = {"num_attention_heads": 2, "attention_head_dim": 12, "num_layers": 2, "cross_attention_dim": 24, "caption_channels": 16}


TEXT_TOKENS = 512  # the pipeline's max_sequence_length (T5)


FAMILY = "allegro"
# 88 frames (4x temporal VAE: 22 latent frames) at 720x1280 px: the pipeline's default.
EXAMPLES = {"allegro": Example("AllegroTransformer3DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks, frames=22)}
