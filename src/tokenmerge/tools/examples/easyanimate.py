"""The examples of the easyanimate family (tokenmerge.families.easyanimate): its published config, a tiny config and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int, frames: int = 3) -> dict[str, Any]:
    """The EasyAnimate pipeline's call at a (frames, height, width) latent: Qwen2-VL text (its mask stays with the text
    encoder), the timestep in the latent's dtype, classifier-free guidance as one batch; the rotary table is the model's."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    return {
        "hidden_states": torch.randn(batch, config.in_channels, frames, height, width, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500.0).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.text_embed_dim, generator=g).to(dtype),
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_layers": min(n, config["num_layers"]), "mmdit_layers": min(n, config["mmdit_layers"])}


# The class defaults (EasyAnimate V5.1's 12B widths, every block MMDiT, Qwen2-VL-7B text), with the 16 latent channels
# and 2x2 patches of the alibaba-pai/EasyAnimateV5.1 checkpoints.
CONFIG = {
    "num_attention_heads": 48,
    "attention_head_dim": 64,
    "in_channels": 16,
    "out_channels": 16,
    "patch_size": 2,
    "sample_width": 90,
    "sample_height": 60,
    "activation_fn": "gelu-approximate",
    "timestep_activation_fn": "silu",
    "num_layers": 48,
    "mmdit_layers": 48,
    "time_embed_dim": 512,
    "text_embed_dim": 3584,
    "text_embed_dim_t5": None,
    "norm_eps": 1e-5,
    "time_position_encoding_type": "3d_rope",
}


# One MMDiT block, then one with shared weights (the model's other kind, where mmdit_layers < num_layers).
SMALL = {
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "in_channels": 4,
    "out_channels": 4,
    "num_layers": 2,
    "mmdit_layers": 1,
    "time_embed_dim": 8,
    "text_embed_dim": 16,
}


TEXT_TOKENS = 256  # the pipeline's max_sequence_length (padded to it)


FAMILY = "easyanimate"
EXAMPLES = {"easyanimate": Example("EasyAnimateTransformer3DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks, frames=13)}
