"""The examples of the auraflow family (tokenmerge.families.auraflow): its published config, a tiny config and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int) -> dict[str, Any]:
    """The AuraFlow pipeline's call at a (height, width) latent: UMT5 text (already multiplied by its mask; no mask
    passed), the timestep / 1000, classifier-free guidance as one batch."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    return {
        "hidden_states": torch.randn(batch, config.in_channels, height, width, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.joint_attention_dim, generator=g).to(dtype),
        "timestep": torch.full((batch,), 0.5).to(dtype),
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    """The first ``n`` MMDiT blocks and eight times as many single-stream blocks (4 and 32)."""
    return {
        **config,
        "num_mmdit_layers": min(n, config["num_mmdit_layers"]),
        "num_single_dit_layers": min(8 * n, config["num_single_dit_layers"]),
    }


# transformer/config.json of fal/AuraFlow-v0.3 (v0.1 and v0.2: pos_embed_max_size 4096).
CONFIG = {
    "sample_size": 64,
    "patch_size": 2,
    "in_channels": 4,
    "num_mmdit_layers": 4,
    "num_single_dit_layers": 32,
    "attention_head_dim": 256,
    "num_attention_heads": 12,
    "joint_attention_dim": 2048,
    "caption_projection_dim": 3072,
    "out_channels": 4,
    "pos_embed_max_size": 9216,
}


# (caption_projection_dim is the width of the text stream, which the register tokens join: the inner width)
SMALL = {
    "sample_size": 16,
    "num_mmdit_layers": 1,
    "num_single_dit_layers": 2,
    "attention_head_dim": 8,
    "num_attention_heads": 2,
    "joint_attention_dim": 16,
    "caption_projection_dim": 16,
    "pos_embed_max_size": 256,
}


TEXT_TOKENS = 256  # the pipeline's max_sequence_length (UMT5, padded to it)


FAMILY = "auraflow"
EXAMPLES = {"auraflow": Example("AuraFlowTransformer2DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks)}
