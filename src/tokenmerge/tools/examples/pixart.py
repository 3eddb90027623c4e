"""The examples of the pixart family (tokenmerge.families.pixart): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int) -> dict[str, Any]:
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    return {
        "hidden_states": torch.randn(batch, config.in_channels, height, width, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.caption_channels, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500.0),
        "added_cond_kwargs": {"resolution": None, "aspect_ratio": None},
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_layers": min(n, config["num_layers"])}


# transformer/config.json of PixArt-alpha/PixArt-Sigma-XL-2-1024-MS.
CONFIG = {
    "sample_size": 128,
    "patch_size": 2,
    "in_channels": 4,
    "out_channels": 8,
    "num_layers": 28,
    "attention_head_dim": 72,
    "num_attention_heads": 16,
    "cross_attention_dim": 1152,
    "caption_channels": 4096,
    "norm_type": "ada_norm_single",
    "norm_elementwise_affine": False,
    "norm_eps": 1e-6,
    "interpolation_scale": 2,
    "use_additional_conditions": False,
}


SMALL = {"num_layers": 2, "attention_head_dim": 8, "num_attention_heads": 2, "cross_attention_dim": 16, "caption_channels": 16}


FAMILY = "pixart"
EXAMPLES = {"pixart": Example("PixArtTransformer2DModel", CONFIG, SMALL, inputs, 300, first_blocks)}
