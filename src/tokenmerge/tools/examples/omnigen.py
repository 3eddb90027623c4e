"""The examples of the omnigen family (tokenmerge.families.omnigen): its published config, tiny config and its pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int) -> dict[str, Any]:
    """The OmniGen pipeline's text-to-image call at a (height, width) latent: ``text_tokens`` prompt ids (no input
    images), the processor's causal-then-bidirectional mask and position ids, classifier-free guidance as one batch."""
    from diffusers.pipelines.omnigen.processor_omnigen import OmniGenCollator

    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    p = config.patch_size
    valid = torch.ones(batch, text_tokens, dtype=torch.long)
    image = [(height // p) * (width // p)] * batch
    collator = OmniGenCollator(hidden_size=config.hidden_size)
    mask, _ = collator.create_mask(valid, image)
    ids = torch.randint(0, config.vocab_size, (batch, text_tokens), generator=g)
    return {
        "hidden_states": torch.randn(batch, config.in_channels, height, width, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500.0),
        "input_ids": torch.where(ids == config.pad_token_id, ids.new_tensor(0), ids),
        "input_img_latents": [],
        "input_image_sizes": {},
        "attention_mask": mask,
        "position_ids": collator.create_position(valid, image),
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_layers": min(n, config["num_layers"])}


def _rope_scaling(head_dim: int) -> dict[str, Any]:
    """Phi-3's "su" rope scaling, with unit factors (the published per-frequency factors are not reproduced here:
    they change the frequencies, not the structure)."""
    return {"type": "su", "short_factor": [1.0] * (head_dim // 2), "long_factor": [1.0] * (head_dim // 2)}


# transformer/config.json of Shitao/OmniGen-v1-diffusers (from memory of the published repo; rope factors: see above).
CONFIG = {
    "hidden_size": 3072,
    "in_channels": 4,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "num_layers": 32,
    "original_max_position_embeddings": 4096,
    "pad_token_id": 32000,
    "patch_size": 2,
    "pos_embed_max_size": 192,
    "rms_norm_eps": 1e-5,
    "rope_base": 10000,
    "rope_scaling": _rope_scaling(96),
    "time_step_dim": 256,
    "vocab_size": 32064,
}


SMALL = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "num_layers": 2,
    "pad_token_id": 2,
    "pos_embed_max_size": 32,
    "rope_scaling": _rope_scaling(16),
    "time_step_dim": 16,
    "vocab_size": 64,
}


TEXT_TOKENS = 64  # a short prompt in the processor's template (its length varies: no padding to a fixed size)


FAMILY = "omnigen"
EXAMPLES = {"omnigen": Example("OmniGenTransformer2DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks)}
