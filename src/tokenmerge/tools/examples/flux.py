"""The examples of the flux family (tokenmerge.families.flux): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import ComfyExample, Example


def grid_ids(h: int, w: int, segment: float = 0.0, axes: int = 3) -> torch.Tensor:
    """Position ids of an h x w token grid as the Flux pipelines build them: (segment, row, col[, 0])."""
    ids = torch.zeros(h, w, axes)
    ids[..., 0] = segment
    ids[..., 1] = torch.arange(h)[:, None]
    ids[..., 2] = torch.arange(w)[None, :]
    return ids.reshape(h * w, axes)


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int) -> dict[str, Any]:
    """A Flux pipeline's call at a (height, width) latent: packed 2x2 patches, grid ids."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    h, w = height // 2, width // 2
    found = {
        "hidden_states": torch.randn(batch, h * w, config.in_channels, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.joint_attention_dim, generator=g).to(dtype),
        "timestep": torch.full((batch,), 0.5),
        "img_ids": grid_ids(h, w),
        "txt_ids": torch.zeros(text_tokens, 3),
    }
    if getattr(config, "pooled_projection_dim", None):
        found["pooled_projections"] = torch.randn(batch, config.pooled_projection_dim, generator=g).to(dtype)
    if getattr(config, "guidance_embeds", False):
        found["guidance"] = torch.full((batch,), 3.5)
    return found


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    """The first ``n`` double-stream blocks and twice as many single-stream blocks (Flux.1's proportion)."""
    return {**config, "num_layers": min(n, config["num_layers"]), "num_single_layers": min(2 * n, config["num_single_layers"])}


# transformer/config.json of black-forest-labs/FLUX.1-dev.
CONFIG = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": 768,
    "guidance_embeds": True,
    "axes_dims_rope": (16, 56, 56),
}


SMALL = {
    "num_layers": 1,
    "num_single_layers": 2,
    "attention_head_dim": 8,
    "num_attention_heads": 2,
    "joint_attention_dim": 16,
    "pooled_projection_dim": 8,
    "axes_dims_rope": (2, 2, 4),
}


FAMILY = "flux"
EXAMPLES = {"flux": Example("FluxTransformer2DModel", CONFIG, SMALL, inputs, 512, first_blocks)}


# ComfyUI's own implementation at a tiny width (and the published one, where the ComfyUI bench runs it).
COMFY = ComfyExample(
    supported="Flux",
    unet_config={
        "image_model": "flux",
        "in_channels": 16,
        "out_channels": 16,
        "patch_size": 2,
        "vec_in_dim": 32,
        "context_in_dim": 32,
        "hidden_size": 64,
        "mlp_ratio": 2.0,
        "num_heads": 4,
        "depth": 1,
        "depth_single_blocks": 2,
        "axes_dim": [4, 6, 6],
        "theta": 10000,
        "qkv_bias": True,
        "guidance_embed": True,
    },
    context=32,
    pooled=32,
    channels=16,
    video=False,
    full={
        "vec_in_dim": 768,
        "context_in_dim": 4096,
        "hidden_size": 3072,
        "mlp_ratio": 4.0,
        "num_heads": 24,
        "axes_dim": [16, 56, 56],
    },
    full_context=4096,
    full_pooled=768,
    blocks={"depth": 1, "depth_single_blocks": 2},
    later_fields=("comfy.ldm.flux.model", "FluxParams", {"txt_ids_dims": []}),
)
