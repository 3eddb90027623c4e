"""The examples of the glm-image family (tokenmerge.families.glmimage): its published config, a tiny config and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int) -> dict[str, Any]:
    """The GLM-Image pipeline's text-to-image call at a (height, width) latent: the latent itself (the root patchifies
    it), the glyph text, one prior token per image token (kept: the conditional branch), the target size in px and no
    crop, the timestep t - 1 in [0, 999], and the key/value caches, empty and without a mode (no condition image)."""
    from diffusers.models.transformers.transformer_glm_image import GlmImageKVCache

    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    p = config.patch_size
    prior = torch.randint(0, config.prior_vq_quantizer_codebook_size, (batch, (height // p) * (width // p)), generator=g)
    return {
        "hidden_states": torch.randn(batch, config.in_channels, height, width, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.text_embed_dim, generator=g).to(dtype),
        "prior_token_id": prior,
        "prior_token_drop": torch.zeros_like(prior, dtype=torch.bool),
        "timestep": torch.full((batch,), 499.0),
        "target_size": torch.tensor([[height * 8.0, width * 8.0]] * batch, dtype=dtype),
        "crop_coords": torch.zeros(batch, 2, dtype=dtype),
        "kv_caches": GlmImageKVCache(num_layers=config.num_layers),
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_layers": min(n, config["num_layers"])}


# The class defaults of diffusers 0.42.1 (written for zai-org/GLM-Image; its transformer/config.json was not at hand).
CONFIG = {
    "patch_size": 2,
    "in_channels": 16,
    "out_channels": 16,
    "num_layers": 30,
    "attention_head_dim": 40,
    "num_attention_heads": 64,
    "text_embed_dim": 1472,
    "time_embed_dim": 512,
    "condition_dim": 256,
    "prior_vq_quantizer_codebook_size": 16384,
}


SMALL = {
    "in_channels": 4,
    "out_channels": 4,
    "num_layers": 2,
    "attention_head_dim": 8,
    "num_attention_heads": 2,
    "text_embed_dim": 16,
    "time_embed_dim": 8,
    "condition_dim": 4,
    "prior_vq_quantizer_codebook_size": 32,
}


# The glyph embeddings of the prompt's quoted text (its own length, not padded); 128 stands for a typical prompt.
TEXT_TOKENS = 128


FAMILY = "glm-image"
EXAMPLES = {"glm-image": Example("GlmImageTransformer2DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks)}
