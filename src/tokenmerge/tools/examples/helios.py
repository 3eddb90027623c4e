"""The examples of the helios family (tokenmerge.families.helios): its published config, tiny config and its pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example
from .wan import first_blocks

# The pipeline's history_sizes (long, mid, short) in latent frames; the short history also holds the first frame
# (keep_first_frame: the image of image-to-video, zeros for text-to-video).
HISTORY = (16, 2, 1 + 1)


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int, frames: int = 3) -> dict[str, Any]:
    """The Helios pipelines' call for one chunk of ``frames`` latent frames at (height, width): umT5 text padded to
    its length; the long, mid and short history latents at the chunk's size, with their frame indices (one row for
    the batch), the chunk's after them."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    long, mid, short = HISTORY
    indices = torch.arange(long + mid + short + frames).unsqueeze(0)
    found: dict[str, Any] = {
        "hidden_states": torch.randn(batch, config.in_channels, frames, height, width, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500.0),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.text_dim, generator=g).to(dtype),
        "indices_hidden_states": indices[:, long + mid + short :],
        "return_dict": False,
    }
    start = 0
    for name, count in zip(("long", "mid", "short"), HISTORY):
        found[f"latents_history_{name}"] = torch.randn(batch, config.in_channels, count, height, width, generator=g).to(dtype)
        found[f"indices_latents_history_{name}"] = indices[:, start : start + count]
        start += count
    return found


# HeliosTransformer3DModel's defaults, the published models' (BestWishYsh/Helios-Base, -Mid, -Distilled: Wan 2.1 14B's
# blocks, multi-term memory patches, cross-attention on the current chunk, history at timestep 0).
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
    "added_kv_proj_dim": None,
    "rope_dim": (44, 42, 42),
    "rope_theta": 10000.0,
    "guidance_cross_attn": True,
    "zero_history_timestep": True,
    "has_multi_term_memory_patch": True,
    "is_amplify_history": False,
    "history_scale_mode": "per_head",
}


# diffusers' own test config.
SMALL = {
    "num_attention_heads": 2,
    "attention_head_dim": 12,
    "in_channels": 4,
    "out_channels": 4,
    "text_dim": 16,
    "ffn_dim": 32,
    "num_layers": 2,
    "rope_dim": (4, 4, 4),
}


# umT5's prompt is padded to 512 tokens.
TEXT_TOKENS = 512


# A 9-latent-frame chunk (33 video frames) at 384x640 px: the pipeline's default.
FRAMES = 9


FAMILY = "helios"
EXAMPLES = {
    "helios": Example("HeliosTransformer3DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks, frames=FRAMES),
}
