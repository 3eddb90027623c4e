"""The examples of the wan-animate family (tokenmerge.families.wananimate): its published config, tiny config and its pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example
from .wan import SMALL_I2V, TEXT_TOKENS, first_blocks


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int, frames: int = 3) -> dict[str, Any]:
    """The Wan Animate pipeline's call at a (frames, height, width) latent, the first frame the character's reference
    slot: the noisy latent with the reference image and the previous segment's condition (and their masks) in the
    channels; umT5 text padded to its length behind the character's CLIP tokens (257); the pose latents of the other
    frames; the segment's face video, 4 video frames per latent frame after the first, at the motion encoder's size."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    if config.added_kv_proj_dim is not None:
        text_tokens = TEXT_TOKENS  # the processor takes whatever precedes the last 512 context tokens as CLIP's
    size = config.motion_encoder_size
    return {
        "hidden_states": torch.randn(batch, config.in_channels, frames, height, width, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500.0),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.text_dim, generator=g).to(dtype),
        "encoder_hidden_states_image": torch.randn(batch, 257, config.image_dim, generator=g).to(dtype),
        "pose_hidden_states": torch.randn(batch, config.latent_channels, frames - 1, height, width, generator=g).to(dtype),
        "face_pixel_values": torch.randn(batch, 3, 4 * (frames - 2) + 1, size, size, generator=g).to(dtype),
        "return_dict": False,
    }


# transformer/config.json of Wan-AI/Wan2.2-Animate-14B-Diffusers (Wan 2.1 I2V 14B's blocks).
CONFIG = {
    "patch_size": (1, 2, 2),
    "num_attention_heads": 40,
    "attention_head_dim": 128,
    "in_channels": 36,
    "latent_channels": 16,
    "out_channels": 16,
    "text_dim": 4096,
    "freq_dim": 256,
    "ffn_dim": 13824,
    "num_layers": 40,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6,
    "image_dim": 1280,
    "added_kv_proj_dim": 5120,
    "rope_max_seq_len": 1024,
    "pos_embed_seq_len": None,
    "motion_encoder_channel_sizes": None,
    "motion_encoder_size": 512,
    "motion_style_dim": 512,
    "motion_dim": 20,
    "motion_encoder_dim": 512,
    "face_encoder_hidden_dim": 1024,
    "face_encoder_num_heads": 4,
    "inject_face_latents_blocks": 5,
    "motion_encoder_batch_size": 8,
}


# diffusers' own test config of the motion and face encoders (16 px faces), Wan I2V's tiny blocks; a face adapter
# after each block.
SMALL = {
    **SMALL_I2V,
    "in_channels": 12,
    "latent_channels": 4,
    "motion_encoder_channel_sizes": {"4": 16, "8": 16, "16": 16},
    "motion_encoder_size": 16,
    "motion_style_dim": 8,
    "motion_dim": 4,
    "motion_encoder_dim": 16,
    "face_encoder_hidden_dim": 16,
    "face_encoder_num_heads": 2,
    "inject_face_latents_blocks": 1,
}


# A 77-frame segment (20 latent frames) after the reference slot, at 720x1280 px: the pipeline's default.
FRAMES = 21


FAMILY = "wan-animate"
EXAMPLES = {
    "wan-animate": Example("WanAnimateTransformer3DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks, frames=FRAMES),
}
