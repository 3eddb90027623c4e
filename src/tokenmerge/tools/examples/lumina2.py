"""The examples of the lumina2 family (tokenmerge.families.lumina2): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import ComfyExample, Example


def inputs(
    model: torch.nn.Module,
    height: int,
    width: int,
    batch: int,
    seed: int,
    text_tokens: int,
    lengths: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """The Lumina2 pipeline's call at a (height, width) latent: the caption padded to ``text_tokens`` (right
    padding) with its 0/1 mask; ``lengths``: each sample's valid tokens (all ``text_tokens`` by default)."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    lengths = tuple(lengths) if lengths is not None else (text_tokens,) * batch
    mask = torch.zeros(batch, max(text_tokens, *lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return {
        "hidden_states": torch.randn(batch, config.in_channels, height, width, generator=g).to(dtype),
        "timestep": torch.full((batch,), 0.5),
        "encoder_hidden_states": torch.randn(batch, mask.shape[1], config.cap_feat_dim, generator=g).to(dtype),
        "encoder_attention_mask": mask,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    """The first ``n`` main layers (the refiners stay: they run before the main layers)."""
    return {**config, "num_layers": min(n, config["num_layers"])}


# transformer/config.json of Alpha-VLLM/Lumina-Image-2.0.
CONFIG = {
    "sample_size": 128,
    "patch_size": 2,
    "in_channels": 16,
    "out_channels": None,
    "hidden_size": 2304,
    "num_layers": 26,
    "num_refiner_layers": 2,
    "num_attention_heads": 24,
    "num_kv_heads": 8,
    "multiple_of": 256,
    "ffn_dim_multiplier": None,
    "norm_eps": 1e-5,
    "scaling_factor": 1.0,
    "axes_dim_rope": (32, 32, 32),
    "axes_lens": (300, 512, 512),
    "cap_feat_dim": 2304,
}


SMALL = {
    "sample_size": 16,
    "in_channels": 4,
    "hidden_size": 24,
    "num_layers": 2,
    "num_refiner_layers": 1,
    "num_attention_heads": 3,
    "num_kv_heads": 1,
    "multiple_of": 2,
    "axes_dim_rope": (4, 2, 2),  # sum = head_dim
    "axes_lens": (128, 128, 128),  # axis 0 > the caption length; axes 1, 2 >= the token grid
    "cap_feat_dim": 32,
}


FAMILY = "lumina2"
EXAMPLES = {"lumina2": Example("Lumina2Transformer2DModel", CONFIG, SMALL, inputs, 256, first_blocks)}


# ComfyUI's own implementation at a tiny width (and the published one, where the ComfyUI bench runs it).
COMFY = ComfyExample(
    supported="Lumina2",
    unet_config={
        "image_model": "lumina2",
        "patch_size": 2,
        "in_channels": 16,
        "dim": 64,
        "cap_feat_dim": 32,
        "n_layers": 2,
        "n_heads": 2,
        "n_kv_heads": 2,
        "qk_norm": True,
        "axes_dims": [8, 12, 12],
        "axes_lens": [300, 512, 512],
    },
    context=32,
    pooled=0,
    channels=16,
    video=False,
    caption_mask=True,  # its text encoders hand over the caption's mask too
)
