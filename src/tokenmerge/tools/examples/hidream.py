"""The examples of the hidream family (tokenmerge.families.hidream): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import ComfyExample, Example


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int) -> dict[str, Any]:
    """The HiDream pipeline's call at a (height, width) latent: the latent itself (the root patchifies it), T5
    tokens, the stack of every Llama layer's hidden states (layers, B, tokens, C), both ``text_tokens`` long, and
    the pooled CLIP embeddings."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    t5_channels, llama_channels = config.caption_channels
    layers = max(config.llama_layers) + 1
    return {
        "hidden_states": torch.randn(batch, config.in_channels, height, width, generator=g).to(dtype),
        "timesteps": torch.full((batch,), 500.0),
        "encoder_hidden_states_t5": torch.randn(batch, text_tokens, t5_channels, generator=g).to(dtype),
        "encoder_hidden_states_llama3": torch.randn(layers, batch, text_tokens, llama_channels, generator=g).to(dtype),
        "pooled_embeds": torch.randn(batch, config.text_emb_dim, generator=g).to(dtype),
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    """The first ``n`` dual-stream blocks and twice as many single-stream blocks (16 and 32), each with its own
    Llama layer (the last one kept also feeds the text context every block shares)."""
    double, single = min(n, config["num_layers"]), min(2 * n, config["num_single_layers"])
    layers = list(config["llama_layers"])
    kept = layers[:double] + layers[config["num_layers"] : config["num_layers"] + single]
    return {**config, "num_layers": double, "num_single_layers": single, "llama_layers": kept}


# transformer/config.json of HiDream-ai/HiDream-I1-Full.
CONFIG = {
    "patch_size": 2,
    "in_channels": 16,
    "out_channels": 16,
    "num_layers": 16,
    "num_single_layers": 32,
    "attention_head_dim": 128,
    "num_attention_heads": 20,
    "caption_channels": [4096, 4096],
    "text_emb_dim": 2048,
    "num_routed_experts": 4,
    "num_activated_experts": 2,
    "axes_dims_rope": (64, 32, 32),
    "max_resolution": (128, 128),
    "llama_layers": list(range(32)) + [31] * 16,
}


SMALL = {
    "in_channels": 4,
    "out_channels": 4,
    "num_layers": 1,
    "num_single_layers": 2,
    "attention_head_dim": 8,
    "num_attention_heads": 4,
    "caption_channels": [8, 4],
    "text_emb_dim": 8,
    "axes_dims_rope": (4, 2, 2),
    "max_resolution": (20, 20),  # 100 tokens: a 9x7 grid is padded with 37
    "llama_layers": [0, 1, 1],
}


FAMILY = "hidream"
EXAMPLES = {"hidream": Example("HiDreamImageTransformer2DModel", CONFIG, SMALL, inputs, 128, first_blocks)}


# ComfyUI's own implementation at a tiny width (and the published one, where the ComfyUI bench runs it).
COMFY = ComfyExample(
    supported="HiDream",
    unet_config={
        "image_model": "hidream",
        "attention_head_dim": 32,
        "axes_dims_rope": [16, 8, 8],
        "caption_channels": [32, 32],
        "max_resolution": [64, 64],
        "in_channels": 16,
        "llama_layers": [0, 1],
        "num_attention_heads": 2,
        "num_routed_experts": 2,
        "num_activated_experts": 1,
        "num_layers": 1,
        "num_single_layers": 1,
        "out_channels": 16,
        "patch_size": 2,
        "text_emb_dim": 32,
    },
    context=32,
    pooled=32,
    channels=16,
    video=False,
    llama3_layers=2,  # the Llama 3 hidden states of the layers the model reads, beside the T5 context
)
