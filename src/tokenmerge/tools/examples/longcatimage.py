"""The examples of the longcat-image family (tokenmerge.families.longcatimage): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example


def position_ids(modality: int, h: int, w: int, start: int) -> torch.Tensor:
    """(modality, row, col) ids of an h x w token grid whose rows and columns start at ``start``, as the LongCat
    pipelines' ``prepare_pos_ids`` builds them for an image."""
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack([torch.full((h, w), modality), rows + start, cols + start], -1).reshape(h * w, 3).float()


def inputs(
    model: torch.nn.Module,
    height: int,
    width: int,
    batch: int,
    seed: int,
    text_tokens: int,
    references: tuple[tuple[int, int], ...] = (),
) -> dict[str, Any]:
    """The LongCat-Image pipelines' call at a (height, width) latent: packed 2x2 patches, the text's ids along the
    diagonal (modality 0), the target's (modality 1) offset past them, timestep / 1000 and no guidance. With
    ``references`` (token grids), the edit pipeline's call: each reference appended after the target on a modality
    of its own (2, then 3, ...: the pipeline appends one reference, as modality 2)."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    h, w = height // 2, width // 2
    tokens = [torch.randn(batch, h * w, config.in_channels, generator=g)]
    ids = [position_ids(1, h, w, text_tokens)]
    for modality, (rh, rw) in enumerate(references, start=2):
        tokens.append(torch.randn(1, rh * rw, config.in_channels, generator=g).expand(batch, -1, -1))
        ids.append(position_ids(modality, rh, rw, text_tokens))
    diagonal = torch.arange(text_tokens, dtype=torch.float32)
    return {
        "hidden_states": torch.cat(tokens, 1).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.joint_attention_dim, generator=g).to(dtype),
        "timestep": torch.full((batch,), 0.5).to(dtype),
        "img_ids": torch.cat(ids),
        "txt_ids": torch.stack([torch.zeros(text_tokens), diagonal, diagonal], -1),
        "guidance": None,
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    """The first ``n`` double-stream blocks and twice as many single-stream blocks (LongCat-Image: 10 and 20)."""
    return {**config, "num_layers": min(n, config["num_layers"]), "num_single_layers": min(2 * n, config["num_single_layers"])}


# transformer/config.json of meituan-longcat/LongCat-Image as recalled (the hub cannot be reached here): the class
# defaults' widths (Qwen2.5-VL-7B's 3584-wide text), 10 double- and 20 single-stream blocks (its 6B parameters).
CONFIG = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 10,
    "num_single_layers": 20,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 3584,
    "pooled_projection_dim": 3584,
    "axes_dims_rope": (16, 56, 56),
}


SMALL = {
    "in_channels": 16,
    "num_layers": 1,
    "num_single_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "joint_attention_dim": 16,
    "pooled_projection_dim": 16,
    "axes_dims_rope": (4, 6, 6),
}


TEXT_TOKENS = 512  # the pipelines' tokenizer_max_length: every prompt is padded to it


FAMILY = "longcat-image"
EXAMPLES = {"longcat-image": Example("LongCatImageTransformer2DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks)}
