"""The examples of the flux3 family (tokenmerge.families.flux3): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example


def grid_ids(h: int, w: int, l_axis: int = 0, scale: float = 0.5) -> torch.Tensor:
    """(t, row, col, l) ids as Flux.3's modular pipeline builds them: rows and columns scaled by ``scale``."""
    ids = torch.cartesian_prod(torch.arange(1), torch.arange(h), torch.arange(w), torch.tensor([l_axis])).float()
    ids[:, 1:3] *= scale
    return ids


def inputs(
    model: torch.nn.Module,
    height: int,
    width: int,
    batch: int,
    seed: int,
    text_tokens: int,
    references: tuple[tuple[int, int], ...] = (),
) -> dict[str, Any]:
    """The modular pipeline's denoiser call at a (height, width) latent (2x2 patches packed), with optional
    condition images (their token grids) in ``image_cond_hidden_states``."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    h, w = height // 2, width // 2
    text_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(text_tokens)).float()
    found = {
        "hidden_states": torch.randn(batch, h * w, config.in_channels, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.joint_attention_dim, generator=g).to(dtype),
        "timestep": torch.full((batch,), 0.5),
        "img_ids": grid_ids(h, w),
        "txt_ids": text_ids,
    }
    if references:
        tokens = [torch.randn(1, rh * rw, config.cond_in_channels, generator=g).expand(batch, -1, -1) for rh, rw in references]
        found["image_cond_hidden_states"] = torch.cat(tokens, 1).to(dtype)
        found["image_cond_ids"] = torch.cat([grid_ids(rh, rw, -(1 + i)) for i, (rh, rw) in enumerate(references)])
    if config.flow_map:
        found["target_timestep"] = torch.full((batch,), 0.25)
    return found


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    """The first ``n`` per-mode blocks of each mode and ``n`` joint blocks (Flux.3 has 5 and 28)."""
    return {**config, "num_layers": min(n, config["num_layers"]), "num_single_layers": min(n, config["num_single_layers"])}


# The class defaults (the published Flux.3 transformer).
CONFIG = {
    "in_channels": 128,
    "cond_in_channels": 128,
    "num_layers": 5,
    "num_single_layers": 28,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 20480,
    "axes_dims_rope": (32, 32, 32, 32),
}


SMALL = {
    "in_channels": 4,
    "cond_in_channels": 4,
    "num_layers": 1,
    "num_single_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "joint_attention_dim": 32,
    "axes_dims_rope": (4, 4, 4, 4),
}


FAMILY = "flux3"
EXAMPLES = {"flux3": Example("Flux3Transformer2DModel", CONFIG, SMALL, inputs, 512, first_blocks)}
