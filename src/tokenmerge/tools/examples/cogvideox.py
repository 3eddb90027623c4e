"""The examples of the cogvideox family (tokenmerge.families.cogvideox): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example


def inputs(
    model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int, frames: int | None = None
) -> dict[str, Any]:
    """The CogVideoX pipelines' call at a (frames, height, width) latent (default: 3 frames of tokens): T5 text, the
    pipeline's 3-D rotary table (where the model uses one), classifier-free guidance as one batch."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed
    from diffusers.pipelines.cogvideo.pipeline_cogvideox import get_resize_crop_region_for_grid

    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    frames = 3 * (config.patch_size_t or 1) if frames is None else frames
    found: dict[str, Any] = {
        "hidden_states": torch.randn(batch, frames, config.in_channels, height, width, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.text_embed_dim, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500, dtype=torch.long),
        "return_dict": False,
    }
    if config.ofs_embed_dim:
        found["ofs"] = torch.full((batch,), 2.0)
    if config.use_rotary_positional_embeddings:
        p, pt = config.patch_size, config.patch_size_t
        gh, gw = height // p, width // p
        base = (config.sample_height // p, config.sample_width // p)
        if pt is None:
            crops = get_resize_crop_region_for_grid((gh, gw), base[1], base[0])
            table = get_3d_rotary_pos_embed(config.attention_head_dim, crops, (gh, gw), frames)
        else:
            table = get_3d_rotary_pos_embed(config.attention_head_dim, None, (gh, gw), frames // pt, grid_type="slice", max_size=base)
        found["image_rotary_emb"] = tuple(t.to(dtype) for t in table)
    return found


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_layers": min(n, config["num_layers"])}


# transformer/config.json of THUDM/CogVideoX-5b (2B: 30 heads, 30 layers, no rotary table).
CONFIG = {
    "num_attention_heads": 48,
    "attention_head_dim": 64,
    "in_channels": 16,
    "out_channels": 16,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "time_embed_dim": 512,
    "text_embed_dim": 4096,
    "num_layers": 42,
    "dropout": 0.0,
    "attention_bias": True,
    "sample_width": 90,
    "sample_height": 60,
    "sample_frames": 49,
    "patch_size": 2,
    "temporal_compression_ratio": 4,
    "max_text_seq_length": 226,
    "activation_fn": "gelu-approximate",
    "timestep_activation_fn": "silu",
    "norm_elementwise_affine": True,
    "norm_eps": 1e-5,
    "spatial_interpolation_scale": 1.875,
    "temporal_interpolation_scale": 1.0,
    "use_rotary_positional_embeddings": True,
    "use_learned_positional_embeddings": False,
}


# THUDM/CogVideoX1.5-5B: frames patched by 2, no patch bias, 768x1360 px default.
CONFIG_15 = {**CONFIG, "patch_size_t": 2, "patch_bias": False, "sample_height": 96, "sample_width": 170, "sample_frames": 81}


SMALL = {
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "time_embed_dim": 8,
    "text_embed_dim": 16,
    "num_layers": 2,
    "sample_width": 16,
    "sample_height": 18,
    "sample_frames": 9,
}


TEXT_TOKENS = 226


FAMILY = "cogvideox"
EXAMPLES = {
    "cogvideox": Example("CogVideoXTransformer3DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks, frames=13),
    "cogvideox15": Example("CogVideoXTransformer3DModel", CONFIG_15, SMALL, inputs, TEXT_TOKENS, first_blocks, frames=21),
}
