"""The examples of the chroma family (tokenmerge.families.chroma): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import ComfyExample, Example
from .flux import grid_ids


def text_mask(batch: int, text_tokens: int, real: int, dtype: torch.dtype) -> torch.Tensor:
    """The Chroma pipeline's text mask (B, T): the ``real`` prompt tokens and the first padding token, as floats."""
    return (torch.arange(text_tokens)[None].expand(batch, -1) <= real).to(dtype)


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int) -> dict[str, Any]:
    """The Chroma pipeline's call at a (height, width) latent: packed 2x2 patches, grid ids, and its attention mask
    [text mask; ones for the image] (B, T + N) in the prompt's dtype (a prompt of half the text length)."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    h, w = height // 2, width // 2
    mask = text_mask(batch, text_tokens, max(1, text_tokens // 2), dtype)
    return {
        "hidden_states": torch.randn(batch, h * w, config.in_channels, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.joint_attention_dim, generator=g).to(dtype),
        "timestep": torch.full((batch,), 0.5).to(dtype),
        "img_ids": grid_ids(h, w).to(dtype),
        "txt_ids": torch.zeros(text_tokens, 3).to(dtype),
        "attention_mask": torch.cat([mask, torch.ones(batch, h * w, dtype=torch.bool)], dim=1),
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    """The first ``n`` double-stream blocks and twice as many single-stream blocks (19 and 38)."""
    return {**config, "num_layers": min(n, config["num_layers"]), "num_single_layers": min(2 * n, config["num_single_layers"])}


# transformer/config.json of lodestones/Chroma (diffusers format, as Chroma1-HD; the class defaults).
CONFIG = {
    "patch_size": 1,
    "in_channels": 64,
    "out_channels": None,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "axes_dims_rope": (16, 56, 56),
    "approximator_num_channels": 64,
    "approximator_hidden_dim": 5120,
    "approximator_layers": 5,
}


SMALL = {
    "in_channels": 16,
    "num_layers": 1,
    "num_single_layers": 2,
    "attention_head_dim": 8,
    "num_attention_heads": 2,
    "joint_attention_dim": 16,
    "axes_dims_rope": (2, 2, 4),
    "approximator_num_channels": 16,
    "approximator_hidden_dim": 32,
    "approximator_layers": 1,
}


FAMILY = "chroma"
EXAMPLES = {"chroma": Example("ChromaTransformer2DModel", CONFIG, SMALL, inputs, 512, first_blocks)}


# ComfyUI's own implementation at a tiny width (and the published one, where the ComfyUI bench runs it).
COMFY = ComfyExample(
    supported="Chroma",
    unet_config={
        "image_model": "chroma",
        "in_channels": 64,
        "out_channels": 64,
        "context_in_dim": 32,
        "hidden_size": 64,
        "mlp_ratio": 2.0,
        "num_heads": 4,
        "depth": 1,
        "depth_single_blocks": 1,
        "axes_dim": [4, 6, 6],
        "theta": 10000,
        "patch_size": 2,
        "qkv_bias": True,
        "in_dim": 64,
        "out_dim": 64,
        "hidden_dim": 64,
        "n_layers": 1,
    },
    context=32,
    pooled=32,
    channels=16,
    video=False,
    later_fields=("comfy.ldm.chroma.model", "ChromaParams", {"txt_ids_dims": [], "vec_in_dim": None}),
)
