"""The examples of the cosmos family (tokenmerge.families.cosmos): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from functools import partial
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
    frames: int = 3,
    condition_frames: int = 0,
) -> dict[str, Any]:
    """The Cosmos pipelines' call at a (frames, height, width) latent: T5 text padded to its length, the padding mask
    (zeros), fps; with ``condition_frames`` (video-to-world), Predict2's condition mask on the leading latent frames
    and its per-frame timestep (B, 1, F, 1, 1), the condition frames at the conditioning sigma's."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    channels = config.in_channels - (1 if condition_frames else 0)  # the model concatenates the condition mask
    found: dict[str, Any] = {
        "hidden_states": torch.randn(batch, channels, frames, height, width, generator=g).to(dtype),
        "timestep": torch.full((batch,), 0.5).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.text_embed_dim, generator=g).to(dtype),
        "fps": 16,
        "padding_mask": torch.zeros(1, 1, height * 8, width * 8, dtype=dtype),
        "return_dict": False,
    }
    if condition_frames:
        indicator = torch.zeros(1, 1, frames, 1, 1, dtype=dtype)
        indicator[:, :, :condition_frames] = 1.0
        found["condition_mask"] = indicator.expand(batch, 1, frames, height, width).contiguous()
        t_condition = 0.0001 / (0.0001 + 1)  # the pipeline's sigma_conditioning
        found["timestep"] = (indicator * t_condition + (1 - indicator) * 0.5).expand(batch, 1, frames, 1, 1).contiguous()
    return found


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_layers": min(n, config["num_layers"])}


# transformer/config.json of nvidia/Cosmos-Predict2-2B-Video2World (from memory of the published repo: 16 latent
# channels and the condition mask; its padding mask concatenated too).
CONFIG = {
    "in_channels": 17,
    "out_channels": 16,
    "num_attention_heads": 16,
    "attention_head_dim": 128,
    "num_layers": 28,
    "mlp_ratio": 4.0,
    "text_embed_dim": 1024,
    "adaln_lora_dim": 256,
    "max_size": (128, 240, 240),
    "patch_size": (1, 2, 2),
    "rope_scale": (1.0, 3.0, 3.0),
    "concat_padding_mask": True,
    "extra_pos_embed_type": None,
}


# nvidia/Cosmos-1.0-Diffusion-7B-Text2World: the class defaults (32 heads, learnable extra positions, rope (2, 1, 1)).
CONFIG_10 = {
    **CONFIG,
    "in_channels": 16,
    "num_attention_heads": 32,
    "rope_scale": (2.0, 1.0, 1.0),
    "extra_pos_embed_type": "learnable",
}


# The padding mask is resized by torchvision, which tokenmerge does not depend on: the tiny models leave it out.
SMALL = {
    "num_attention_heads": 2,
    "attention_head_dim": 12,
    "num_layers": 2,
    "mlp_ratio": 2.0,
    "text_embed_dim": 16,
    "adaln_lora_dim": 8,
    "max_size": (32, 64, 64),
    "concat_padding_mask": False,
}


TEXT_TOKENS = 512  # T5-11B, padded to its length


FAMILY = "cosmos"
EXAMPLES = {
    # 93 frames (Wan VAE, 4x temporal: 24 latent frames) at 704x1280 px from one input frame: Predict2's default.
    "cosmos2-v2w": Example(
        "CosmosTransformer3DModel", CONFIG, SMALL, partial(inputs, condition_frames=1), TEXT_TOKENS, first_blocks, frames=24
    ),
    # 121 frames (its tokenizer: 8x temporal, 16 latent frames) at 704x1280 px.
    "cosmos": Example("CosmosTransformer3DModel", CONFIG_10, SMALL, inputs, TEXT_TOKENS, first_blocks, frames=16, frame_factor=8),
}
