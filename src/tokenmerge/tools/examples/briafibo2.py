"""The examples of the bria-fibo-2 family (tokenmerge.families.briafibo2): its published config, tiny config and its pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example


def inputs(
    model: torch.nn.Module,
    height: int,
    width: int,
    batch: int,
    seed: int,
    text_tokens: int,
    references: tuple[tuple[int, int], ...] = (),
) -> dict[str, Any]:
    """The FIBO 2 pipeline's call at a (height, width) latent: the noise level in [0, 1], the text encoder's bundles
    (the Perceiver's, then one per injection block) and no mask (the pipeline passes one only where a batch's prompts
    are padded). With ``references`` (token grids), an edit's ``context_latents``, one latent per image."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    p, bundles = config.patch_size, 1 + len(config.injection_layer_ids)
    return {
        "hidden_states": torch.randn(batch, config.in_channels, height, width, generator=g).to(dtype),
        "timestep": torch.full((batch,), 0.5),
        "encoder_hidden_states": torch.randn(batch, bundles, text_tokens, config.cap_feat_dim, generator=g).to(dtype),
        "context_latents": [
            torch.randn(1, config.in_channels, rh * p, rw * p, generator=g).expand(batch, -1, -1, -1).to(dtype) for rh, rw in references
        ]
        or None,
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    """The first ``n`` main layers, with the injection blocks among them (the refiners run before them and stay)."""
    ids = tuple(i for i in config["injection_layer_ids"] if i < n)
    return {**config, "n_layers": min(n, config["n_layers"]), "injection_layer_ids": ids}


# The class defaults (the published transformer/config.json could not be read here): 44 main layers at width 3584,
# five injection blocks, 32-channel latents in 2x2 patches, Qwen3-VL's 7680-wide stacked hidden states.
CONFIG = {
    "in_channels": 32,
    "patch_size": 2,
    "dim": 3584,
    "n_layers": 44,
    "n_refiner_layers": 2,
    "n_heads": 28,
    "norm_eps": 1e-5,
    "cap_feat_dim": 7680,
    "injection_layer_ids": (6, 14, 22, 30, 38),
    "perceiver_num_layers": 2,
    "min_num_gist_tokens": 256,
    "max_num_gist_tokens": 512,
    "gist_step": 64,
    "gist_min_text_len": 256,
    "gist_max_text_len": 2048,
    "rope_theta": 256.0,
    "t_scale": 1000.0,
    "axes_dims": (32, 48, 48),
    "axes_lens": (2048, 512, 512),
}


# An injection block among the two main layers; 4 to 8 gist tokens (6 for the tests' 5-token prompts).
SMALL = {
    "in_channels": 4,
    "dim": 32,
    "n_layers": 2,
    "n_refiner_layers": 1,
    "n_heads": 2,
    "cap_feat_dim": 16,
    "injection_layer_ids": (1,),
    "perceiver_num_layers": 1,
    "min_num_gist_tokens": 4,
    "max_num_gist_tokens": 8,
    "gist_step": 2,
    "gist_min_text_len": 4,
    "gist_max_text_len": 12,
    "axes_dims": (4, 6, 6),  # sum = head_dim
    "axes_lens": (64, 64, 64),  # axis 0 > max gist + 1 + references
}


# The prompt's tokens: FIBO's structured JSON captions, assumed about this long (384 gist tokens).
TEXT_TOKENS = 1024


FAMILY = "bria-fibo-2"
EXAMPLES = {"bria-fibo-2": Example("BriaFibo2Transformer2DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks)}
