"""The examples of the sd3 family (tokenmerge.families.sd3): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import ComfyExample, Example


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int) -> dict[str, Any]:
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    return {
        "hidden_states": torch.randn(batch, config.in_channels, height, width, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.joint_attention_dim, generator=g).to(dtype),
        "pooled_projections": torch.randn(batch, config.pooled_projection_dim, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500.0),
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    config = {**config, "num_layers": min(n, config["num_layers"])}
    if "dual_attention_layers" in config:
        config["dual_attention_layers"] = tuple(i for i in config["dual_attention_layers"] if i < config["num_layers"])
    return config


# transformer/config.json of stabilityai/stable-diffusion-3-medium and -3.5-medium.
SD3 = {
    "sample_size": 128,
    "patch_size": 2,
    "in_channels": 16,
    "num_layers": 24,
    "attention_head_dim": 64,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "caption_projection_dim": 1536,
    "pooled_projection_dim": 2048,
    "out_channels": 16,
    "pos_embed_max_size": 192,
}


SD35 = {**SD3, "pos_embed_max_size": 384, "qk_norm": "rms_norm", "dual_attention_layers": tuple(range(13))}


SMALL = {"num_layers": 2, "attention_head_dim": 8, "num_attention_heads": 2, "joint_attention_dim": 16, "caption_projection_dim": 16}


SMALL = {**SMALL, "pooled_projection_dim": 8}


FAMILY = "sd3"
EXAMPLES = {
    "sd3": Example("SD3Transformer2DModel", SD3, SMALL, inputs, 333, first_blocks),
    "sd35": Example("SD3Transformer2DModel", SD35, {**SMALL, "dual_attention_layers": (0,)}, inputs, 333, first_blocks),
}


# ComfyUI's own implementation at a tiny width (and the published one, where the ComfyUI bench runs it).
COMFY = ComfyExample(
    supported="SD3",
    unet_config={
        "in_channels": 16,
        "out_channels": 16,
        "patch_size": 2,
        "depth": 2,
        "input_size": None,
        "adm_in_channels": 32,
        "context_embedder_config": {"target": "torch.nn.Linear", "params": {"in_features": 32, "out_features": 128}},
        "num_patches": 4096,
        "pos_embed_max_size": 64,
        "pos_embed_scaling_factor": None,
        "qk_norm": None,
        "x_block_self_attn_layers": [],
    },
    context=32,
    pooled=32,
    channels=16,
    video=False,
)
