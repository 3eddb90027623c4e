"""The examples of the bria family (tokenmerge.families.bria): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example
from .flux import grid_ids


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int) -> dict[str, Any]:
    """The Bria pipeline's call at a (height, width) latent: packed 2x2 patches, grid ids and zero text ids (2-D, as
    the pipeline drops their batch axis), the scheduler's timestep as it is (no guidance, no pooled text)."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    h, w = height // 2, width // 2
    return {
        "hidden_states": torch.randn(batch, h * w, config.in_channels, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.joint_attention_dim, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500.0),
        "img_ids": grid_ids(h, w).to(dtype),
        "txt_ids": torch.zeros(text_tokens, 3).to(dtype),
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    """The first ``n`` double-stream blocks and twice as many single-stream blocks (the class defaults' proportion)."""
    return {**config, "num_layers": min(n, config["num_layers"]), "num_single_layers": min(2 * n, config["num_single_layers"])}


# The class defaults (Flux.1's widths and depths, 12B): briaai/BRIA-3.2's transformer/config.json (a 4B transformer,
# gated on the hub) could not be read here, so its block counts are not known.
CONFIG = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": None,
    "guidance_embeds": False,
    "axes_dims_rope": (16, 56, 56),
    "rope_theta": 10000,
    "time_theta": 10000,
}


SMALL = {
    "in_channels": 16,
    "num_layers": 1,
    "num_single_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "joint_attention_dim": 16,
    "axes_dims_rope": (4, 6, 6),
}


TEXT_TOKENS = 128  # the pipeline's max_sequence_length (T5, zero-padded)


FAMILY = "bria"
EXAMPLES = {"bria": Example("BriaTransformer2DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks)}
