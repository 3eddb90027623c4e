"""The examples of the hunyuandit family (tokenmerge.families.hunyuandit): its published config, tiny config and its pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int) -> dict[str, Any]:
    """The Hunyuan-DiT pipeline's call at a (height, width) latent: BERT and T5 text at the lengths the model pads
    them to (its ``text_len`` and ``text_len_t5``: ``text_tokens`` cannot change them), the pipeline's 2-D rotary
    table, size and style conditions, classifier-free guidance as one batch."""
    from diffusers.models.embeddings import get_2d_rotary_pos_embed
    from diffusers.pipelines.hunyuandit.pipeline_hunyuandit import get_resize_crop_region_for_grid

    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    p = config.patch_size
    grid, base = (height // p, width // p), 64 // p  # the pipeline's base size: 512 px
    table = get_2d_rotary_pos_embed(model.inner_dim // model.num_heads, get_resize_crop_region_for_grid(grid, base), grid, output_type="pt")
    px = (height * 8, width * 8)
    return {
        "hidden_states": torch.randn(batch, config.in_channels, height, width, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500.0).to(dtype),
        "encoder_hidden_states": torch.randn(batch, config.text_len, config.cross_attention_dim, generator=g).to(dtype),
        "text_embedding_mask": torch.ones(batch, config.text_len, dtype=torch.long),
        "encoder_hidden_states_t5": torch.randn(batch, config.text_len_t5, config.cross_attention_dim_t5, generator=g).to(dtype),
        "text_embedding_mask_t5": torch.ones(batch, config.text_len_t5, dtype=torch.long),
        "image_meta_size": torch.tensor([[*px, *px, 0, 0]] * batch, dtype=dtype),
        "style": torch.zeros(batch, dtype=torch.long),
        "image_rotary_emb": tuple(t.to(dtype) for t in table),
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    """The first blocks, an even number of them: each block of the second half takes a skip from one of the first."""
    return {**config, "num_layers": min(max(2, n + n % 2), config["num_layers"])}


# transformer/config.json of Tencent-Hunyuan/HunyuanDiT-v1.2-Diffusers (from memory of the published repo; v1.1 and
# earlier condition on style and image size: use_style_cond_and_image_meta_size=True).
CONFIG = {
    "activation_fn": "gelu-approximate",
    "attention_head_dim": 88,
    "cross_attention_dim": 1024,
    "cross_attention_dim_t5": 2048,
    "hidden_size": 1408,
    "in_channels": 4,
    "learn_sigma": True,
    "mlp_ratio": 4.3637,
    "norm_type": "layer_norm",
    "num_attention_heads": 16,
    "num_layers": 40,
    "patch_size": 2,
    "pooled_projection_dim": 1024,
    "sample_size": 128,
    "text_len": 77,
    "text_len_t5": 256,
    "use_style_cond_and_image_meta_size": False,
}


# Four blocks: the fourth takes the first's skip. The meta size and style conditions exercised.
SMALL = {
    "attention_head_dim": 8,
    "num_attention_heads": 2,
    "hidden_size": 16,
    "num_layers": 4,
    "cross_attention_dim": 16,
    "cross_attention_dim_t5": 16,
    "pooled_projection_dim": 16,
    "text_len": 5,
    "text_len_t5": 7,
    "mlp_ratio": 2.0,
    "use_style_cond_and_image_meta_size": True,
}


TEXT_TOKENS = 77 + 256  # BERT's and T5's padded lengths, joined


FAMILY = "hunyuandit"
EXAMPLES = {"hunyuandit": Example("HunyuanDiT2DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks)}
