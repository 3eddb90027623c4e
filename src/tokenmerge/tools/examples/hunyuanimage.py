"""The examples of the hunyuanimage family (tokenmerge.families.hunyuanimage): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example

GLYPH_TOKENS = 128  # the pipeline's tokenizer_2_max_length (ByT5)


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int) -> dict[str, Any]:
    """The HunyuanImage pipelines' call at a (height, width) latent, the timestep as the scheduler gives it (x1000):
    Qwen2.5-VL text padded to its length, its mask (a prompt of half of it); where the model projects glyph text,
    ByT5's for a prompt without quoted text (zeros, masked out); the distilled models' guidance (3.25, x1000) and
    the refiner's call: its latent (one frame) with the condition image's concatenated as channels."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    refiner = len(config.patch_size) == 3
    shape = (batch, config.in_channels, 1, height, width) if refiner else (batch, config.in_channels, height, width)
    mask = (torch.arange(text_tokens)[None] < max(1, text_tokens // 2)).long().expand(batch, -1)
    found = {
        "hidden_states": torch.randn(*shape, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500.0).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.text_embed_dim, generator=g).to(dtype),
        "encoder_attention_mask": mask,
        "return_dict": False,
    }
    if config.text_embed_2_dim is not None:
        found["encoder_hidden_states_2"] = torch.zeros(batch, GLYPH_TOKENS, config.text_embed_2_dim, dtype=dtype)
        found["encoder_attention_mask_2"] = torch.zeros(batch, GLYPH_TOKENS, dtype=torch.long)
    if config.guidance_embeds:
        found["guidance"] = torch.full((batch,), 3250.0).to(dtype)
    return found


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    """The first ``n`` double-stream blocks and twice as many single-stream blocks (20 and 40)."""
    return {**config, "num_layers": min(n, config["num_layers"]), "num_single_layers": min(2 * n, config["num_single_layers"])}


# transformer/config.json of hunyuanvideo-community/HunyuanImage-2.1-Diffusers: the class defaults, with ByT5's
# 1472-wide glyph text (as recalled: the hub cannot be reached here).
CONFIG = {
    "in_channels": 64,
    "out_channels": 64,
    "num_attention_heads": 28,
    "attention_head_dim": 128,
    "num_layers": 20,
    "num_single_layers": 40,
    "num_refiner_layers": 2,
    "mlp_ratio": 4.0,
    "patch_size": (1, 1),
    "qk_norm": "rms_norm",
    "guidance_embeds": False,
    "text_embed_dim": 3584,
    "text_embed_2_dim": 1472,
    "rope_theta": 256.0,
    "rope_axes_dim": (64, 64),
    "use_meanflow": False,
}


# Without the glyph projection: its hidden layer is 2048 wide whatever the config (fixed in the class), which would
# outweigh the tiny blocks in any count of the work.
SMALL = {
    "in_channels": 16,
    "out_channels": 16,
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "num_layers": 1,
    "num_single_layers": 1,
    "num_refiner_layers": 1,
    "text_embed_dim": 16,
    "text_embed_2_dim": None,
    "rope_axes_dim": (8, 8),
}


# transformer/config.json of hunyuanvideo-community/HunyuanImage-2.1-Refiner-Diffusers, assumed (the hub cannot be
# reached here): the base's widths, distilled guidance, 1x1x1 patches of one latent frame, its latent and the
# condition image's as 128 channels, no glyph text.
REFINER = {
    **CONFIG,
    "in_channels": 128,
    "patch_size": (1, 1, 1),
    "guidance_embeds": True,
    "text_embed_2_dim": None,
    "rope_axes_dim": (16, 56, 56),
}


SMALL_REFINER = {**SMALL, "in_channels": 32, "rope_axes_dim": (4, 6, 6)}


TEXT_TOKENS = 1000  # the pipeline's tokenizer_max_length (the refiner's: 256), padded to it


FAMILY = "hunyuanimage"
EXAMPLES = {
    "hunyuanimage": Example(
        "HunyuanImageTransformer2DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks, latent_multiple=1, vae_factor=32
    ),
    "hunyuanimage-refiner": Example(
        "HunyuanImageTransformer2DModel", REFINER, SMALL_REFINER, inputs, 256, first_blocks, latent_multiple=1, vae_factor=16
    ),
}
