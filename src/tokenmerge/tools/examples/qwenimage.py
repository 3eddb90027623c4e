"""The examples of the qwen-image family (tokenmerge.families.qwenimage): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

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
    references: tuple[tuple[int, int], ...] = (),
) -> dict[str, Any]:
    """The Qwen-Image pipelines' call at a (height, width) latent: packed 2x2 patches, ``img_shapes`` per sample,
    no text mask (the pipelines pass None when no prompt is padded); with ``references`` (token grids), the edit
    pipelines' call: reference images appended after the target, in ``hidden_states`` and in ``img_shapes``."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    h, w = height // 2, width // 2
    tokens = [torch.randn(batch, h * w, config.in_channels, generator=g)]
    shapes = [(1, h, w)]
    for rh, rw in references:
        tokens.append(torch.randn(1, rh * rw, config.in_channels, generator=g).expand(batch, -1, -1))
        shapes.append((1, rh, rw))
    return {
        "hidden_states": torch.cat(tokens, 1).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.joint_attention_dim, generator=g).to(dtype),
        "encoder_hidden_states_mask": None,
        "timestep": torch.full((batch,), 0.5).to(dtype),  # the pipelines pass t / 1000
        "img_shapes": [shapes] * batch,
        "guidance": None,
        "attention_kwargs": {},
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_layers": min(n, config["num_layers"])}


# transformer/config.json of Qwen/Qwen-Image (the keys the class takes; its unused pooled_projection_dim left out).
CONFIG = {
    "patch_size": 2,
    "in_channels": 64,
    "out_channels": 16,
    "num_layers": 60,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 3584,
    "guidance_embeds": False,
    "axes_dims_rope": (16, 56, 56),
}


# axes_dims_rope sums to the head size; p * p * out_channels = in_channels, as in the published model.
SMALL = {
    "in_channels": 16,
    "out_channels": 4,
    "num_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "joint_attention_dim": 16,
    "axes_dims_rope": (8, 4, 4),
}


# The prompt is not padded to max_sequence_length (512): its own length after the template's 34 tokens; 128 stands
# for a typical prompt.
TEXT_TOKENS = 128


FAMILY = "qwen-image"
EXAMPLES = {"qwen-image": Example("QwenImageTransformer2DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks)}


# ComfyUI's own implementation at a tiny width (and the published one, where the ComfyUI bench runs it).
COMFY = ComfyExample(
    supported="QwenImage",
    unet_config={
        "image_model": "qwen_image",
        "in_channels": 64,
        "out_channels": 16,
        "num_layers": 2,
        "attention_head_dim": 16,
        "num_attention_heads": 2,
        "joint_attention_dim": 32,
        "axes_dims_rope": (4, 6, 6),
    },
    context=32,
    pooled=0,
    channels=16,
    video=False,
    full={"attention_head_dim": 128, "num_attention_heads": 24, "joint_attention_dim": 3584, "axes_dims_rope": (16, 56, 56)},
    full_context=3584,
    full_pooled=0,
    blocks={"num_layers": 1},
)
