"""The examples of the motif-video family (tokenmerge.families.motifvideo): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int, frames: int = 3) -> dict[str, Any]:
    """The Motif-Video pipelines' call at a (frames, height, width) latent: the latent, condition latent and mask
    concatenated on channels, the text padded to its length with its mask (the last token of each prompt padding);
    image-to-video models (``image_embed_dim``) the vision tokens of the first frame."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    mask = torch.ones(batch, text_tokens, dtype=torch.bool)
    mask[:, -1] = False
    found: dict[str, Any] = {
        "hidden_states": torch.randn(batch, config.in_channels, frames, height, width, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500.0),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.text_embed_dim, generator=g).to(dtype),
        "encoder_attention_mask": mask,
        "return_dict": False,
    }
    if config.image_embed_dim is not None:
        found["image_embeds"] = torch.randn(batch, IMAGE_TOKENS, config.image_embed_dim, generator=g).to(dtype)
    return found


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    singles = min(2 * n, config["num_single_layers"])
    decoders = min(config.get("num_decoder_layers", 0), singles)
    return {**config, "num_layers": min(n, config["num_layers"]), "num_single_layers": singles, "num_decoder_layers": decoders}


# MotifVideoTransformer3DModel's defaults (the published transformer/config.json was not read here: no hub access):
# 20 dual-stream and 40 single-stream blocks of 24 heads x 128, the 33 channels of [latent; condition; mask].
CONFIG = {
    "in_channels": 33,
    "out_channels": 16,
    "num_attention_heads": 24,
    "attention_head_dim": 128,
    "num_layers": 20,
    "num_single_layers": 40,
    "num_decoder_layers": 0,
    "mlp_ratio": 4.0,
    "patch_size": 2,
    "patch_size_t": 1,
    "qk_norm": "rms_norm",
    "norm_type": "layer_norm",
    "text_embed_dim": 4096,
    "image_embed_dim": None,
    "rope_theta": 256.0,
    "rope_axes_dim": (16, 56, 56),
}


# The tiny model's blocks carry the optional text cross-attentions, so that the tests cover them.
SMALL = {
    "in_channels": 9,
    "out_channels": 4,
    "num_attention_heads": 2,
    "attention_head_dim": 12,
    "num_layers": 1,
    "num_single_layers": 2,
    "text_embed_dim": 16,
    "rope_axes_dim": (4, 4, 4),
    "enable_text_cross_attention_dual": True,
    "enable_text_cross_attention_single": True,
}


SMALL_I2V = {**SMALL, "image_embed_dim": 8}


IMAGE_TOKENS = 16  # the tiny vision tower's tokens


# The pipelines pad the prompt to max_sequence_length (512) and pass its mask.
TEXT_TOKENS = 512


# 121 frames (4x temporal VAE: 31 latent frames) at 736x1280 px: the pipelines' default.
FRAMES = 31


FAMILY = "motif-video"
EXAMPLES = {
    "motif-video": Example("MotifVideoTransformer3DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks, frames=FRAMES),
    "motif-video-i2v": Example(
        "MotifVideoTransformer3DModel",
        {**CONFIG, "image_embed_dim": 1152},  # a SigLIP-width vision tower: a guess, as the config above
        SMALL_I2V,
        inputs,
        TEXT_TOKENS,
        first_blocks,
        frames=FRAMES,
    ),
}
