"""The examples of the ovis-image family (tokenmerge.families.ovisimage): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example
from .flux import grid_ids


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int) -> dict[str, Any]:
    """The Ovis-Image pipeline's call at a (height, width) latent: packed 2x2 patches, grid ids, the text's ids along
    the diagonal (0, i, i), timestep / 1000."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    h, w = height // 2, width // 2
    diagonal = torch.arange(text_tokens, dtype=torch.float32)
    return {
        "hidden_states": torch.randn(batch, h * w, config.in_channels, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.joint_attention_dim, generator=g).to(dtype),
        "timestep": torch.full((batch,), 0.5).to(dtype),
        "img_ids": grid_ids(h, w).to(dtype),
        "txt_ids": torch.stack([torch.zeros(text_tokens), diagonal, diagonal], -1).to(dtype),
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    """The first ``n`` double-stream blocks and four times as many single-stream blocks (Ovis-Image: 6 and 27)."""
    return {**config, "num_layers": min(n, config["num_layers"]), "num_single_layers": min(4 * n, config["num_single_layers"])}


# The class defaults, which are AIDC-AI/Ovis-Image-7B's transformer (6 double- and 27 single-stream blocks, Ovis 2.5's
# 2048-wide text).
CONFIG = {
    "patch_size": 1,
    "in_channels": 64,
    "out_channels": 64,
    "num_layers": 6,
    "num_single_layers": 27,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 2048,
    "axes_dims_rope": (16, 56, 56),
}


SMALL = {
    "in_channels": 16,
    "out_channels": 16,
    "num_layers": 1,
    "num_single_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "joint_attention_dim": 16,
    "axes_dims_rope": (4, 6, 6),
}


TEXT_TOKENS = 256  # the pipeline's max_sequence_length: every prompt is padded to it


FAMILY = "ovis-image"
EXAMPLES = {"ovis-image": Example("OvisImageTransformer2DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks)}
