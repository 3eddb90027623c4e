"""The examples of the prx family (tokenmerge.families.prx): its published config, a tiny config and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example


def _unzeroed(model: torch.nn.Module) -> None:
    """Random weights for the blocks' modulation, which the class's ``__init__`` zeroes (a training start: every gate
    0, each block the identity); left alone once they are not all zero."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for block in model.blocks:
            linear = block.modulation.lin
            if not linear.weight.any():
                linear.weight.copy_(torch.randn(linear.weight.shape, generator=g) * 0.1)
                linear.bias.copy_(torch.randn(linear.bias.shape, generator=g) * 0.1)


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int) -> dict[str, Any]:
    """The PRX pipeline's call at a (height, width) latent: the latent itself (the root patchifies it), the text padded
    to its maximum length and its mask (here the last token is padding), t / 1000. A model whose zero-initialised
    modulation was never trained gets random weights there first (see :func:`_unzeroed`)."""
    _unzeroed(model)
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    mask = torch.ones(batch, text_tokens, dtype=torch.bool)
    mask[:, -1] = text_tokens < 2
    return {
        "hidden_states": torch.randn(batch, config.in_channels, height, width, generator=g).to(dtype),
        "timestep": torch.full((batch,), 0.5),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.context_in_dim, generator=g).to(dtype),
        "attention_mask": mask,
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "depth": min(n, config["depth"])}


# The class defaults of diffusers 0.42.1 (written for Photoroom/prx-512-t2i-sft; its transformer/config.json was not at hand).
CONFIG = {
    "in_channels": 16,
    "patch_size": 2,
    "context_in_dim": 2304,
    "hidden_size": 1792,
    "mlp_ratio": 3.5,
    "num_heads": 28,
    "depth": 16,
    "axes_dim": [32, 32],
    "theta": 10000,
    "time_factor": 1000.0,
    "time_max_period": 10000,
}


# axes_dim sums to the head size (asserted by the model).
SMALL = {"in_channels": 4, "context_in_dim": 16, "hidden_size": 32, "mlp_ratio": 2.0, "num_heads": 2, "depth": 2, "axes_dim": [8, 8]}


# T5Gemma text padded to the pipeline's max_sequence_length (256).
TEXT_TOKENS = 256


FAMILY = "prx"
EXAMPLES = {"prx": Example("PRXTransformer2DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks)}
