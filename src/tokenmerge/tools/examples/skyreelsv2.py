"""The examples of the skyreels-v2 family (tokenmerge.families.skyreelsv2): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from . import Example
from .wan import SMALL, SMALL_I2V, TEXT_TOKENS, first_blocks
from .wan import inputs as wan_inputs


def inputs(
    model: torch.nn.Module,
    height: int,
    width: int,
    batch: int,
    seed: int,
    text_tokens: int,
    frames: int = 3,
    diffusion_forcing: bool = False,
) -> dict[str, Any]:
    """The SkyReels-V2 pipelines' call at a (frames, height, width) latent: Wan's (umT5 text padded to its length; I2V
    models the CLIP image tokens and 20 extra channels); the diffusion-forcing pipelines (``diffusion_forcing``) a
    per-frame timestep whose first frame, the image of image-to-video, is clean (0), ``enable_diffusion_forcing=True``
    and, where the model embeds it, the fps class (1: not 16 fps) per sample."""
    found = wan_inputs(model, height, width, batch, seed, text_tokens, frames)
    if diffusion_forcing:
        timestep = torch.full((batch, frames // model.config.patch_size[0]), 500.0)
        timestep[:, 0] = 0.0
        found.update(timestep=timestep, enable_diffusion_forcing=True)
        if model.config.inject_sample_info:
            found["fps"] = [1] * batch
    return found


# transformer/config.json of Skywork/SkyReels-V2-T2V-14B-540P-Diffusers (Wan 2.1 14B's shape).
CONFIG = {
    "patch_size": (1, 2, 2),
    "num_attention_heads": 40,
    "attention_head_dim": 128,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": 4096,
    "freq_dim": 256,
    "ffn_dim": 13824,
    "num_layers": 40,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6,
    "image_dim": None,
    "added_kv_proj_dim": None,
    "rope_max_seq_len": 1024,
    "inject_sample_info": False,
    "num_frame_per_block": 1,
}


# Skywork/SkyReels-V2-I2V-14B-540P-Diffusers: the image latent and mask as 20 more channels, CLIP ViT-H image tokens.
I2V = {**CONFIG, "in_channels": 36, "image_dim": 1280, "added_kv_proj_dim": 5120}


# Skywork/SkyReels-V2-DF-1.3B-540P-Diffusers: Wan 2.1 1.3B's shape with the fps embedding of diffusion forcing.
DF = {**CONFIG, "num_attention_heads": 12, "ffn_dim": 8960, "num_layers": 30, "inject_sample_info": True}


# Without the fps embedding: diffusers 0.42 adds it to the per-frame modulation with a broadcast that holds at batch 1
# only (the batch-size tests run 1-3 samples); the blocks see the same per-token modulation either way.
SMALL_DF = {**SMALL, "inject_sample_info": False}


# 97 frames (4x temporal VAE: 25 latent frames) at 544x960 px: the pipelines' default.
FRAMES = 25


FAMILY = "skyreels-v2"
EXAMPLES = {
    "skyreels-v2": Example("SkyReelsV2Transformer3DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks, frames=FRAMES),
    "skyreels-v2-i2v": Example("SkyReelsV2Transformer3DModel", I2V, SMALL_I2V, inputs, TEXT_TOKENS, first_blocks, frames=FRAMES),
    "skyreels-v2-df": Example(
        "SkyReelsV2Transformer3DModel",
        DF,
        SMALL_DF,
        partial(inputs, diffusion_forcing=True),
        TEXT_TOKENS,
        first_blocks,
        frames=FRAMES,
    ),
}
