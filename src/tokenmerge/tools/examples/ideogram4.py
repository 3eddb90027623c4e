"""The examples of the ideogram4 family (tokenmerge.families.ideogram4): its published config, a tiny config and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example

IMAGE_POSITION_OFFSET = 65536  # diffusers' transformer_ideogram4.IMAGE_POSITION_OFFSET
LLM_TOKEN, OUTPUT_IMAGE, PADDING = 3, 2, -1  # its indicator values and the padding's segment id


def inputs(
    model: torch.nn.Module,
    height: int,
    width: int,
    batch: int,
    seed: int,
    text_tokens: int,
    lengths: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """The Ideogram 4 pipeline's conditional call at a (height, width) latent: [left padding; prompt; image] packed to
    ``text_tokens`` + image tokens per sample (``lengths``: each prompt's own length, one token short of ``text_tokens``
    by default, so that every sample has left padding), zero latents over the text rows and zero text features over
    the image rows, and the ids the pipeline builds (``_prepare_ids``)."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    lengths = tuple(lengths) if lengths is not None else (max(1, text_tokens - 1),) * batch
    h, w = height // 2, width // 2
    n, total = h * w, text_tokens + h * w
    grid = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij"), -1).reshape(n, 2)
    image_ids = torch.cat([torch.zeros(n, 1, dtype=torch.long), grid], 1) + IMAGE_POSITION_OFFSET
    position_ids = torch.zeros(batch, total, 3, dtype=torch.long)
    segment_ids = torch.full((batch, total), PADDING, dtype=torch.long)
    indicator = torch.zeros(batch, total, dtype=torch.long)
    for b, length in enumerate(lengths):
        offset = text_tokens - length
        position_ids[b, offset:text_tokens] = torch.arange(length)[:, None]
        position_ids[b, text_tokens:] = image_ids
        indicator[b, offset:text_tokens], indicator[b, text_tokens:] = LLM_TOKEN, OUTPUT_IMAGE
        segment_ids[b, offset:] = 1
    latents = torch.randn(batch, n, config.in_channels, generator=g)
    text = torch.randn(batch, text_tokens, config.llm_features_dim, generator=g) * (indicator[:, :text_tokens, None] == LLM_TOKEN)
    return {
        "hidden_states": torch.cat([torch.zeros(batch, text_tokens, config.in_channels), latents], 1).to(dtype),
        "timestep": torch.full((batch,), 0.5, dtype=dtype),  # the pipeline passes 1 - t / 1000
        "encoder_hidden_states": torch.cat([text, torch.zeros(batch, n, config.llm_features_dim)], 1).to(dtype),
        "position_ids": position_ids,
        "segment_ids": segment_ids,
        "indicator": indicator,
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_layers": min(n, config["num_layers"])}


# The class defaults of diffusers 0.42.1 (written for ideogram-ai/ideogram-v4; its transformer/config.json was not at hand).
CONFIG = {
    "in_channels": 128,
    "num_layers": 34,
    "attention_head_dim": 256,
    "num_attention_heads": 18,
    "intermediate_size": 12288,
    "adaln_dim": 512,
    "llm_features_dim": 53248,
    "rope_theta": 5_000_000,
    "mrope_section": (24, 20, 20),
    "norm_eps": 1e-5,
}


# 3 x the (row, column) sections within half the head size (8), as the rotary's interleaving needs.
SMALL = {
    "in_channels": 16,
    "num_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "adaln_dim": 16,
    "llm_features_dim": 24,
    "mrope_section": (4, 2, 2),
}


# The pipeline pads every prompt on the left to max_sequence_length (2048).
TEXT_TOKENS = 2048


FAMILY = "ideogram4"
EXAMPLES = {"ideogram4": Example("Ideogram4Transformer2DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks)}
