"""The examples of the bria-fibo family (tokenmerge.families.briafibo): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example
from .flux import grid_ids


def inputs(
    model: torch.nn.Module,
    height: int,
    width: int,
    batch: int,
    seed: int,
    text_tokens: int,
    references: tuple[tuple[int, int], ...] = (),
) -> dict[str, Any]:
    """The FIBO pipelines' call at a (height, width) latent of their 16x VAE: 1x1 patches (``do_patching=False``, the
    default), grid ids and zero text ids, the text encoder's last two layers as the text and its last layers, one per
    block (the pipelines' list, stacked here into one (blocks, B, T, C) tensor, which the model iterates over the
    same way); no mask (the pipelines pass one only where a prompt is padded). With ``references`` (token grids),
    FIBO Edit's call: reference images appended after the target, each on its own ids plane (1, 2, ...)."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    tokens = [torch.randn(batch, height * width, config.in_channels, generator=g)]
    ids = [grid_ids(height, width)]
    for plane, (rh, rw) in enumerate(references, start=1):
        tokens.append(torch.randn(1, rh * rw, config.in_channels, generator=g).expand(batch, -1, -1))
        ids.append(grid_ids(rh, rw, segment=plane))
    blocks = config.num_layers + config.num_single_layers
    return {
        "hidden_states": torch.cat(tokens, 1).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.joint_attention_dim, generator=g).to(dtype),
        "text_encoder_layers": torch.randn(blocks, batch, text_tokens, config.text_encoder_dim, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500.0).to(dtype),
        "img_ids": torch.cat(ids).to(dtype),
        "txt_ids": torch.zeros(text_tokens, 3).to(dtype),
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    """The first ``n`` double-stream blocks and five times as many single-stream blocks (FIBO: 8 and 38)."""
    return {**config, "num_layers": min(n, config["num_layers"]), "num_single_layers": min(5 * n, config["num_single_layers"])}


# transformer/config.json of briaai/FIBO as recalled (the hub cannot be reached here): the class defaults' widths,
# 8 double- and 38 single-stream blocks (its 8B parameters), the Wan 2.2 VAE's 48 latent channels, SmolLM3-3B's
# 2048-wide layers.
CONFIG = {
    "patch_size": 1,
    "in_channels": 48,
    "num_layers": 8,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": None,
    "guidance_embeds": False,
    "axes_dims_rope": (16, 56, 56),
    "rope_theta": 10000,
    "time_theta": 10000,
    "text_encoder_dim": 2048,
}


SMALL = {
    "in_channels": 16,
    "num_layers": 1,
    "num_single_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "joint_attention_dim": 32,
    "axes_dims_rope": (4, 6, 6),
    "text_encoder_dim": 16,
}


# The prompt's tokens (padded to the longest prompt of the call, at most 3000): FIBO's prompts are structured JSON
# captions, assumed about this long.
TEXT_TOKENS = 1024


FAMILY = "bria-fibo"
EXAMPLES = {
    "bria-fibo": Example("BriaFiboTransformer2DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks, latent_multiple=1, vae_factor=16)
}
