"""The examples of the hunyuanvideo15 family (tokenmerge.families.hunyuanvideo15): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import ComfyExample, Example
from .hunyuanvideo import COMFY as HUNYUANVIDEO_COMFY


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int, frames: int = 3) -> dict[str, Any]:
    """The HunyuanVideo 1.5 pipelines' call at a (frames, height, width) latent: the prompt (every token valid),
    an empty glyph text (ByT5, all masked, as for a prompt without quoted text), zero image tokens (text-to-video),
    the latent with its condition channels; one call per guidance branch."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    glyph = 8 if text_tokens < 64 else 256
    return {
        "hidden_states": torch.randn(batch, config.in_channels, frames, height, width, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500.0),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.text_embed_dim, generator=g).to(dtype),
        "encoder_attention_mask": torch.ones(batch, text_tokens, dtype=torch.long),
        "encoder_hidden_states_2": torch.zeros(batch, glyph, config.text_embed_2_dim).to(dtype),
        "encoder_attention_mask_2": torch.zeros(batch, glyph, dtype=torch.long),
        "image_embeds": torch.zeros(batch, 729 if text_tokens >= 64 else 4, config.image_embed_dim).to(dtype),
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_layers": min(n, config["num_layers"])}


# transformer/config.json of the HunyuanVideo-1.5 480p text-to-video model (the class's defaults; 16x VAE, patch 1).
CONFIG = {
    "in_channels": 65,
    "out_channels": 32,
    "num_attention_heads": 16,
    "attention_head_dim": 128,
    "num_layers": 54,
    "num_refiner_layers": 2,
    "mlp_ratio": 4.0,
    "patch_size": 1,
    "patch_size_t": 1,
    "qk_norm": "rms_norm",
    "text_embed_dim": 3584,
    "text_embed_2_dim": 1472,
    "image_embed_dim": 1152,
    "rope_theta": 256.0,
    "rope_axes_dim": (16, 56, 56),
    "target_size": 640,
    "task_type": "t2v",
}


SMALL = {
    "in_channels": 9,
    "out_channels": 4,
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "num_layers": 2,
    "num_refiner_layers": 1,
    "text_embed_dim": 16,
    "text_embed_2_dim": 8,
    "image_embed_dim": 8,
    "rope_axes_dim": (4, 6, 6),
}


# The prompt after the template (at most 1000 tokens, not padded: its own length); 256 stands for a typical one.
TEXT_TOKENS = 256


FAMILY = "hunyuanvideo15"
EXAMPLES = {
    "hunyuanvideo15": Example(
        "HunyuanVideo15Transformer3DModel",
        CONFIG,
        SMALL,
        inputs,
        TEXT_TOKENS,
        first_blocks,
        frames=31,
        latent_multiple=1,
        vae_factor=16,
    )
}


# ComfyUI 0.33's HunyuanVideo15 (HunyuanVideo's class with byT5 glyph text, a SigLIP projection, the condition-type
# embedding and 1x1x1 patches of a 32-channel latent; 65 input channels: latent, image condition, mask), at a tiny
# width: its conditioning adds byT5 tokens and SigLIP tokens, placed before the prompt in the joint attention.
COMFY = ComfyExample(
    supported="HunyuanVideo15",
    unet_config={
        **HUNYUANVIDEO_COMFY.unet_config,
        "in_channels": 65,
        "out_channels": 32,
        "patch_size": [1, 1, 1],
        "byt5": True,
        "vision_in_dim": 16,
    },
    context=32,
    pooled=32,
    channels=32,
    video=True,
    since="0.33.0",
    later_fields=(
        "comfy.ldm.hunyuan_video.model",
        "HunyuanVideoParams",
        {"use_cond_type_embedding": True, "meanflow_sum": False},
    ),
    extra_conditioning=(("conditioning_byt5small", 6, 1472),),
    clip_vision=(5, 16),
    downscale=16,
)
