"""The examples of the joyimage-edit-plus family (tokenmerge.families.joyimage): its published config, tiny config and its pipeline's call, for tests and benchmarks."""

from __future__ import annotations

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
    references: tuple[tuple[int, int], ...] = (),
) -> dict[str, Any]:
    """The JoyImage Edit Plus pipeline's call at a (height, width) latent: the target's patches, then each reference
    image's (``references``: token grids), patchified into (B, N, C, pt, ph, pw) with their ``shape_list``; the text
    with its tokenizer mask (the pipeline always passes it); the scheduler's timestep."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    pt, ph, pw = config.patch_size
    shapes = [(1, height // ph, width // pw), *((1, rh, rw) for rh, rw in references)]
    tokens = sum(t * h * w for t, h, w in shapes)
    return {
        "hidden_states": torch.randn(batch, tokens, config.in_channels, pt, ph, pw, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500.0),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.text_dim, generator=g).to(dtype),
        "encoder_hidden_states_mask": torch.ones(batch, text_tokens, dtype=torch.long),
        "shape_list": [list(shapes) for _ in range(batch)],
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_layers": min(n, config["num_layers"])}


# The class defaults (the published transformer/config.json could not be read here): 20 double-stream blocks at
# width 3072, 2x2 patches of 16-channel latents, 4096-wide text.
CONFIG = {
    "patch_size": (1, 2, 2),
    "in_channels": 16,
    "hidden_size": 3072,
    "num_attention_heads": 24,
    "text_dim": 4096,
    "mlp_width_ratio": 4.0,
    "num_layers": 20,
    "rope_dim_list": (16, 56, 56),
    "rope_type": "rope",
    "theta": 256,
}


SMALL = {
    "in_channels": 4,
    "hidden_size": 32,
    "num_attention_heads": 2,
    "text_dim": 16,
    "num_layers": 2,
    "rope_dim_list": (4, 6, 6),  # sum = head_dim
}


# The instruction in the pipeline's prompt template (padded to the batch's longest prompt), assumed about this long.
TEXT_TOKENS = 256


FAMILY = "joyimage-edit-plus"
EXAMPLES = {"joyimage-edit-plus": Example("JoyImageEditPlusTransformer3DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks)}
