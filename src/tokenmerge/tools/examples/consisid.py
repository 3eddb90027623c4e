"""The examples of the consisid family (tokenmerge.families.consisid): its published config, a tiny config and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example
from .cogvideox import CONFIG as COGVIDEOX

FACE_TOKENS = 577  # EVA-CLIP ViT-L/14 at 336 px: 24 x 24 patches and the class token, at each of its LFE_num_scale layers


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int, frames: int = 3) -> dict[str, Any]:
    """The ConsisID pipeline's call at a (frames, height, width) latent: the noisy latent and the image latent
    concatenated by channels, T5 text, the pipeline's 3-D rotary table, classifier-free guidance as one batch, and the
    face embeddings of the one reference face (batch 1, whatever the batch)."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed
    from diffusers.pipelines.cogvideo.pipeline_cogvideox import get_resize_crop_region_for_grid

    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    p = config.patch_size
    gh, gw = height // p, width // p
    crops = get_resize_crop_region_for_grid((gh, gw), config.sample_width // p, config.sample_height // p)
    table = get_3d_rotary_pos_embed(config.attention_head_dim, crops, (gh, gw), frames)
    found: dict[str, Any] = {
        "hidden_states": torch.randn(batch, frames, config.in_channels, height, width, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.text_embed_dim, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500, dtype=torch.long),
        "image_rotary_emb": tuple(t.to(dtype) for t in table),
        "return_dict": False,
    }
    if config.is_train_face:
        found["id_cond"] = torch.randn(1, config.LFE_id_dim, generator=g).to(dtype)
        found["id_vit_hidden"] = [
            torch.randn(1, FACE_TOKENS, config.LFE_vit_dim, generator=g).to(dtype) for _ in range(config.LFE_num_scale)
        ]
    return found


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_layers": min(n, config["num_layers"])}


# transformer/config.json of BestWishYsh/ConsisID-preview (CogVideoX-5B-I2V's width and depth, with the face modules).
CONFIG = {
    **COGVIDEOX,
    "in_channels": 32,
    "use_learned_positional_embeddings": True,
    "is_train_face": True,
    "is_kps": False,
    "cross_attn_interval": 2,
    "cross_attn_dim_head": 128,
    "cross_attn_num_heads": 16,
    "LFE_id_dim": 1280,
    "LFE_vit_dim": 1024,
    "LFE_depth": 10,
    "LFE_dim_head": 64,
    "LFE_num_heads": 16,
    "LFE_num_id_token": 5,
    "LFE_num_querie": 32,
    "LFE_output_dim": 2048,
    "LFE_ff_mult": 4,
    "LFE_num_scale": 5,
    "local_face_scale": 1.0,
}


# Learned positions are only defined at the sample size (the model refuses any other): sin-cos ones here, so that the
# tests' sizes run. The face's output width is two thirds of the model's (3 x 16 -> 32).
SMALL = {
    "num_attention_heads": 3,
    "attention_head_dim": 16,
    "time_embed_dim": 8,
    "text_embed_dim": 16,
    "num_layers": 2,
    "sample_width": 16,
    "sample_height": 18,
    "sample_frames": 9,
    "use_learned_positional_embeddings": False,
    "cross_attn_interval": 1,
    "cross_attn_dim_head": 8,
    "cross_attn_num_heads": 2,
    "LFE_id_dim": 8,
    "LFE_vit_dim": 8,
    "LFE_depth": 2,
    "LFE_dim_head": 4,
    "LFE_num_heads": 2,
    "LFE_num_id_token": 2,
    "LFE_num_querie": 4,
    "LFE_output_dim": 32,
    "LFE_ff_mult": 1,
    "LFE_num_scale": 2,
}


TEXT_TOKENS = 226


FAMILY = "consisid"
EXAMPLES = {"consisid": Example("ConsisIDTransformer3DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks, frames=13)}
