"""The examples of the flux2 family (tokenmerge.families.flux2): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import ComfyExample, Example


def grid_ids(h: int, w: int, t: int = 0) -> torch.Tensor:
    """(t, row, col, l) ids of an h x w grid, as the Flux.2 pipeline builds them (int64)."""
    return torch.cartesian_prod(torch.tensor([t]), torch.arange(h), torch.arange(w), torch.arange(1))


def inputs(
    model: torch.nn.Module,
    height: int,
    width: int,
    batch: int,
    seed: int,
    text_tokens: int,
    references: tuple[tuple[int, int], ...] = (),
) -> dict[str, Any]:
    """The Flux.2 pipeline's call at a (height, width) latent (packed 2x2 patches), with optional reference images
    (their token grids), appended after the target as the edit pipeline does."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    h, w = height // 2, width // 2
    tokens = [torch.randn(batch, h * w, config.in_channels, generator=g)]
    ids = [grid_ids(h, w)]
    for i, (rh, rw) in enumerate(references):
        tokens.append(torch.randn(1, rh * rw, config.in_channels, generator=g).expand(batch, -1, -1))
        ids.append(grid_ids(rh, rw, 10 + 10 * i))
    text_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(text_tokens))
    found = {
        "hidden_states": torch.cat(tokens, 1).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.joint_attention_dim, generator=g).to(dtype),
        "timestep": torch.full((batch,), 0.5),
        "img_ids": torch.cat(ids).expand(batch, -1, -1),
        "txt_ids": text_ids.expand(batch, -1, -1),
    }
    if config.guidance_embeds:
        found["guidance"] = torch.full((batch,), 4.0)
    return found


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    """The first ``n`` double-stream and ``n`` single-stream blocks (FLUX.2-dev has 8 and 48; at full width one of
    each is 1.5 B parameters, what a 24 GiB machine can time)."""
    return {**config, "num_layers": min(n, config["num_layers"]), "num_single_layers": min(n, config["num_single_layers"])}


# transformer/config.json of black-forest-labs/FLUX.2-dev (the class defaults).
CONFIG = {
    "patch_size": 1,
    "in_channels": 128,
    "num_layers": 8,
    "num_single_layers": 48,
    "attention_head_dim": 128,
    "num_attention_heads": 48,
    "joint_attention_dim": 15360,
    "timestep_guidance_channels": 256,
    "axes_dims_rope": (32, 32, 32, 32),
    "guidance_embeds": True,
}


SMALL = {
    "in_channels": 4,
    "num_layers": 1,
    "num_single_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "joint_attention_dim": 32,
    "axes_dims_rope": (4, 4, 4, 4),
}


FAMILY = "flux2"
EXAMPLES = {"flux2": Example("Flux2Transformer2DModel", CONFIG, SMALL, inputs, 512, first_blocks)}


# ComfyUI's own implementation at a tiny width (and the published one, where the ComfyUI bench runs it).
COMFY = ComfyExample(
    supported="Flux2",
    unet_config={
        "image_model": "flux2",
        "in_channels": 128,
        "out_channels": 128,
        "patch_size": 1,
        "vec_in_dim": None,
        "context_in_dim": 32,
        "hidden_size": 64,
        "mlp_ratio": 3.0,
        "num_heads": 4,
        "depth": 1,
        "depth_single_blocks": 2,
        "axes_dim": [4, 4, 4, 4],
        "theta": 2000,
        "qkv_bias": False,
        "guidance_embed": True,
        "txt_ids_dims": [3],
        "global_modulation": True,
        "mlp_silu_act": True,
        "ops_bias": False,
        "default_ref_method": "index",
        "ref_index_scale": 10.0,
    },
    context=32,
    pooled=0,
    channels=128,
    video=False,
    since="0.4",  # model detection's Flux.2 keys: 1x1 patches of a 128-channel latent
    full={"context_in_dim": 15360, "hidden_size": 6144, "num_heads": 48, "axes_dim": [32, 32, 32, 32]},
    full_context=15360,
    blocks={"depth": 1, "depth_single_blocks": 1},  # as the diffusers example's first blocks: one of each
    downscale=16,
)
