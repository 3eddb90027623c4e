"""The examples of the kandinsky5 family (tokenmerge.families.kandinsky5): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import torch

from . import Example


def modulated(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with random modulation projections where they are still zero: diffusers zero-initialises them (a
    trained checkpoint never has them so), which gates every block shut, and every method would change nothing."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "modulation" in name and not p.any():
                bound = 1 / math.sqrt(p.shape[-1])
                p.copy_(torch.empty(p.shape).uniform_(-bound, bound, generator=g).to(p.dtype))
    return model


def inputs(
    model: torch.nn.Module,
    height: int,
    width: int,
    batch: int,
    seed: int,
    text_tokens: int,
    frames: int = 3,
    condition_frame: bool = False,
) -> dict[str, Any]:
    """The Kandinsky 5 pipelines' call at a (frames, height, width) latent, channels last: Qwen2.5-VL text and its
    CLIP pooled embedding, the visual rotary positions over the token grid, the T2V pipeline's scale factor; with
    ``visual_cond`` the condition latent (zeros) and mask channels, the mask set on the first frame for image-to-video
    (``condition_frame``), whose latent is then the clean image."""
    config, g, dtype = modulated(model).config, torch.Generator().manual_seed(seed), model.dtype
    channels = config.in_visual_dim
    x = torch.randn(batch, frames, height, width, channels, generator=g)
    if config.visual_cond:
        mask = torch.zeros(batch, frames, height, width, 1)
        mask[:, 0] = float(condition_frame)
        x = torch.cat([x, torch.zeros_like(x), mask], dim=-1)
    pt, ph, pw = config.patch_size
    return {
        "hidden_states": x.to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.in_text_dim, generator=g).to(dtype),
        "pooled_projections": torch.randn(batch, config.in_text_dim2, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500.0).to(dtype),
        "visual_rope_pos": [torch.arange(frames // pt), torch.arange(height // ph), torch.arange(width // pw)],
        "text_rope_pos": torch.arange(text_tokens),
        "scale_factor": (1, 2, 2),
        "sparse_params": None,
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_visual_blocks": min(n, config["num_visual_blocks"])}


# transformer/config.json of kandinskylab/Kandinsky-5.0-T2V-Lite-sft-5s-Diffusers, as remembered (not read here: no
# hub access); the 10 s models set attention_type="nabla", whose calls run unchanged. Pro (19B): model_dim 4096,
# ff_dim 16384, 60 visual blocks, axes_dims (32, 48, 48).
CONFIG = {
    "in_visual_dim": 16,
    "out_visual_dim": 16,
    "in_text_dim": 3584,
    "in_text_dim2": 768,
    "time_dim": 512,
    "patch_size": (1, 2, 2),
    "model_dim": 1792,
    "ff_dim": 7168,
    "num_text_blocks": 2,
    "num_visual_blocks": 32,
    "axes_dims": (16, 24, 24),
    "visual_cond": True,
    "attention_type": "regular",
}


SMALL = {
    "in_visual_dim": 4,
    "out_visual_dim": 4,
    "in_text_dim": 16,
    "in_text_dim2": 8,
    "time_dim": 16,
    "model_dim": 32,
    "ff_dim": 64,
    "num_text_blocks": 1,
    "num_visual_blocks": 2,
    "axes_dims": (4, 6, 6),
}


# The pipelines pass the prompt's own length (no padding for one prompt; at most max_sequence_length=512): 256 stands
# for a long prompt.
TEXT_TOKENS = 256


# 121 frames (4x temporal VAE: 31 latent frames) at 512x768 px: the T2V pipeline's default.
FRAMES = 31


FAMILY = "kandinsky5"
EXAMPLES = {
    "kandinsky5": Example("Kandinsky5Transformer3DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks, frames=FRAMES),
    "kandinsky5-i2v": Example(
        "Kandinsky5Transformer3DModel",
        CONFIG,
        SMALL,
        partial(inputs, condition_frame=True),
        TEXT_TOKENS,
        first_blocks,
        frames=FRAMES,
    ),
}
