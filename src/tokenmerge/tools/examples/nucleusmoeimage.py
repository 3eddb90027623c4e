"""The examples of the nucleusmoe-image family (tokenmerge.families.nucleusmoeimage): its published config, a tiny config and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example


def _experts_set(model: torch.nn.Module) -> None:
    """Seeded random weights for the MoE experts, which the class's ``__init__`` leaves unset (``torch.empty``: whatever
    the memory held); the same values at every call."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__ == "SwiGLUExperts":
                for weight in (module.gate_up_proj, module.down_proj):
                    weight.copy_(torch.randn(weight.shape, generator=g) / weight.shape[1] ** 0.5)


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int) -> dict[str, Any]:
    """The NucleusMoE-Image pipeline's call at a (height, width) latent: packed 2x2 patches, ``img_shapes`` one
    ``(1, h, w)`` per sample, the prompt padded to the batch's longest and its mask (here the last token is padding),
    t / 1000. The experts' unset weights are set first (see :func:`_experts_set`)."""
    _experts_set(model)
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    h, w = height // 2, width // 2
    mask = torch.ones(batch, text_tokens, dtype=torch.bool)
    mask[:, -1] = text_tokens < 2
    return {
        "hidden_states": torch.randn(batch, h * w, config.in_channels, generator=g).to(dtype),
        "img_shapes": [(1, h, w)] * batch,
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.joint_attention_dim, generator=g).to(dtype),
        "encoder_hidden_states_mask": mask,
        "timestep": torch.full((batch,), 0.5, dtype=dtype),
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    """The first ``n`` blocks (the first three dense, as in the published model, then MoE)."""
    return {**config, "num_layers": min(n, config["num_layers"])}


# The class defaults of diffusers 0.42.1 (written for NucleusAI/NucleusMoE-Image; its transformer/config.json was not at hand).
CONFIG = {
    "patch_size": 2,
    "in_channels": 64,
    "num_layers": 24,
    "attention_head_dim": 128,
    "num_attention_heads": 16,
    "joint_attention_dim": 3584,
    "axes_dims_rope": (16, 56, 56),
    "mlp_ratio": 4.0,
    "moe_enabled": True,
    "dense_moe_strategy": "leave_first_three_and_last_block_dense",
    "num_experts": 128,
    "moe_intermediate_dim": 1344,
    "capacity_factors": 8.0,
    "route_scale": 2.5,
}


# One dense block, then one MoE block; capacity_factors <= num_experts (each expert takes at most every token);
# axes_dims_rope sums to the head size; mlp_ratio so that the dense SwiGLU keeps an inner width (multiples of 128).
SMALL = {
    "in_channels": 16,
    "num_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "joint_attention_dim": 16,
    "axes_dims_rope": (4, 6, 6),
    "mlp_ratio": 8.0,
    "dense_moe_strategy": "leave_first_block_dense",
    "num_experts": 4,
    "moe_intermediate_dim": 16,
    "capacity_factors": 2.0,
}


# The prompt padded to the batch's longest; 128 stands for a typical prompt.
TEXT_TOKENS = 128


FAMILY = "nucleusmoe-image"
EXAMPLES = {"nucleusmoe-image": Example("NucleusMoEImageTransformer2DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks)}
