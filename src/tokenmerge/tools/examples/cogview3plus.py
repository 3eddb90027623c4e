"""The examples of the cogview3plus family (tokenmerge.families.cogview3plus): its published config, a tiny config and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int) -> dict[str, Any]:
    """The CogView3-Plus pipeline's call at a (height, width) latent: T5 text, the SDXL-style size conditions in px
    (original = target = the image's, no crop), classifier-free guidance as one batch."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    size = torch.tensor([[height * 8, width * 8]] * batch, dtype=dtype)
    return {
        "hidden_states": torch.randn(batch, config.in_channels, height, width, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.text_embed_dim, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500, dtype=torch.long),
        "original_size": size,
        "target_size": size.clone(),
        "crop_coords": torch.zeros(batch, 2, dtype=dtype),
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_layers": min(n, config["num_layers"])}


# transformer/config.json of THUDM/CogView3-Plus-3B (the class defaults).
CONFIG = {
    "patch_size": 2,
    "in_channels": 16,
    "num_layers": 30,
    "attention_head_dim": 40,
    "num_attention_heads": 64,
    "out_channels": 16,
    "text_embed_dim": 4096,
    "time_embed_dim": 512,
    "condition_dim": 256,
    "pos_embed_max_size": 128,
    "sample_size": 128,
}


SMALL = {
    "in_channels": 4,
    "num_layers": 2,
    "attention_head_dim": 8,
    "num_attention_heads": 2,
    "out_channels": 4,
    "text_embed_dim": 16,
    "time_embed_dim": 8,
    "condition_dim": 4,
    "pos_embed_max_size": 16,
    "sample_size": 16,
}


TEXT_TOKENS = 224  # the pipeline's max_sequence_length (T5, padded to it)


FAMILY = "cogview3plus"
EXAMPLES = {"cogview3plus": Example("CogView3PlusTransformer2DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks)}
