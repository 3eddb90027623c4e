"""The examples of the hunyuanvideo family (tokenmerge.families.hunyuanvideo): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import ComfyExample, Example


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int, frames: int = 3) -> dict[str, Any]:
    """The HunyuanVideo pipelines' call at a (frames, height, width) latent: Llama text (every token valid) with
    CLIP's pooled prompt, the distilled guidance scale (6.0, x1000), one call per guidance branch."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    return {
        "hidden_states": torch.randn(batch, config.in_channels, frames, height, width, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500, dtype=torch.long),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.text_embed_dim, generator=g).to(dtype),
        "encoder_attention_mask": torch.ones(batch, text_tokens, dtype=torch.long),
        "pooled_projections": torch.randn(batch, config.pooled_projection_dim, generator=g).to(dtype),
        "guidance": torch.full((batch,), 6000.0).to(dtype),
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_layers": min(n, config["num_layers"]), "num_single_layers": min(n, config["num_single_layers"])}


# transformer/config.json of hunyuanvideo-community/HunyuanVideo (13B).
CONFIG = {
    "in_channels": 16,
    "out_channels": 16,
    "num_attention_heads": 24,
    "attention_head_dim": 128,
    "num_layers": 20,
    "num_single_layers": 40,
    "num_refiner_layers": 2,
    "mlp_ratio": 4.0,
    "patch_size": 2,
    "patch_size_t": 1,
    "qk_norm": "rms_norm",
    "guidance_embeds": True,
    "text_embed_dim": 4096,
    "pooled_projection_dim": 768,
    "rope_theta": 256.0,
    "rope_axes_dim": (16, 56, 56),
}


SMALL = {
    "in_channels": 4,
    "out_channels": 4,
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "num_layers": 1,
    "num_single_layers": 1,
    "num_refiner_layers": 1,
    "text_embed_dim": 16,
    "pooled_projection_dim": 8,
    "rope_axes_dim": (4, 6, 6),
}


# HunyuanVideo-I2V: the image latent concatenated as channels, and its first frame replaced in the tokens.
I2V = {**CONFIG, "in_channels": 33, "image_condition_type": "token_replace"}


SMALL_I2V = {**SMALL, "in_channels": 9, "image_condition_type": "token_replace"}


TEXT_TOKENS = 256  # the pipeline's max_sequence_length (the prompt template's tokens cropped)


FAMILY = "hunyuanvideo"
EXAMPLES = {
    "hunyuanvideo": Example("HunyuanVideoTransformer3DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks, frames=33),
    "hunyuanvideo-i2v": Example("HunyuanVideoTransformer3DModel", I2V, SMALL_I2V, inputs, TEXT_TOKENS, first_blocks, frames=33),
}


# ComfyUI's own implementation at a tiny width (and the published one, where the ComfyUI bench runs it).
COMFY = ComfyExample(
    supported="HunyuanVideo",
    unet_config={
        "image_model": "hunyuan_video",
        "in_channels": 16,
        "out_channels": 16,
        "vec_in_dim": 32,
        "context_in_dim": 32,
        "hidden_size": 64,
        "mlp_ratio": 2.0,
        "num_heads": 2,
        "depth": 1,
        "depth_single_blocks": 1,
        "axes_dim": [8, 12, 12],
        "theta": 256,
        "patch_size": [1, 2, 2],
        "qkv_bias": True,
        "guidance_embed": True,
        "byt5": False,
        "meanflow": False,
    },
    context=32,
    pooled=32,
    channels=16,
    video=True,
    later_fields=(
        "comfy.ldm.hunyuan_video.model",
        "HunyuanVideoParams",
        {"use_cond_type_embedding": False, "vision_in_dim": None, "meanflow_sum": False},
    ),
)
