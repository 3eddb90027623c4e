"""Chroma (lodestones/Chroma, Chroma1-HD): Flux.1 with one modulation network for all blocks and a text mask.

Double-stream ``ChromaTransformerBlock``s as Flux.1's: [text; image] in the joint attention, whose image output
is element 0; the image stream is merged around the attention and around ``ff``. Then
``ChromaSingleTransformerBlock``s, which get [text; image] already concatenated by the root (their
``hidden_states`` is the joint sequence) and run attention and MLP in parallel on one normalised sequence,
merged from ``norm``'s output (element 0) to ``proj_out``'s.

Grid (and any reference images) from ``img_ids`` (0, row, col), one host read per ids tensor; text length from
the root's ``encoder_hidden_states``. Rotary: one (cos, sin) table shared by the batch, rows [text; image],
applied inside the processor: each sample's rows are gathered at its kept positions (hooks.tokens.SampleRows).

Mask: the pipeline passes ``attention_mask`` (B, T + N), float 0/1 (text after the first padding token 0, image
1); each block turns it into (B, 1, S, S) and hands it to its attention as ``attention_mask``. A merge gathers
its rows and its columns at the kept positions (declared as two follows of the joint stream); downsampled keys
take their mask columns at ``dispatch_attention_fn`` (which needs a nearest ``kv_interpolation``, the default:
with another one the keys of a masked call are left whole, with a warning). The float mask is kept as the
pipeline made it (diffusers adds it to the logits); a merge only selects its entries.
"""

from __future__ import annotations

from typing import Any

import torch

from . import Example, Family
from .base import ComfyModel, Container, DenoiserLayout, Follow, IdsLayout, joint_block, single_stream_block
from .flux import grid_ids

ROTARY = Follow("image_rotary_emb", dim=0, stream="joint")
MASK = (Follow("attention_mask", dim=-1, stream="joint"), Follow("attention_mask", dim=-2, stream="joint"))
FOLLOWS = (ROTARY, *MASK)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [joint_block(b, follows=FOLLOWS) for b in getattr(module, "transformer_blocks", [])]
    blocks += [single_stream_block(b, input_stream="joint", follows=FOLLOWS) for b in getattr(module, "single_transformer_blocks", [])]
    reader = IdsLayout(module, ("text", "image", "reference"))
    return DenoiserLayout(module, [Container(module, blocks, 1, reader)], "chroma", single_level=True) if blocks else None


def text_mask(batch: int, text_tokens: int, real: int, dtype: torch.dtype) -> torch.Tensor:
    """The Chroma pipeline's text mask (B, T): the ``real`` prompt tokens and the first padding token, as floats."""
    return (torch.arange(text_tokens)[None].expand(batch, -1) <= real).to(dtype)


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int) -> dict[str, Any]:
    """The Chroma pipeline's call at a (height, width) latent: packed 2x2 patches, grid ids, and its attention mask
    [text mask; ones for the image] (B, T + N) in the prompt's dtype (a prompt of half the text length)."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    h, w = height // 2, width // 2
    mask = text_mask(batch, text_tokens, max(1, text_tokens // 2), dtype)
    return {
        "hidden_states": torch.randn(batch, h * w, config.in_channels, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.joint_attention_dim, generator=g).to(dtype),
        "timestep": torch.full((batch,), 0.5).to(dtype),
        "img_ids": grid_ids(h, w).to(dtype),
        "txt_ids": torch.zeros(text_tokens, 3).to(dtype),
        "attention_mask": torch.cat([mask, torch.ones(batch, h * w, dtype=torch.bool)], dim=1),
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    """The first ``n`` double-stream blocks and twice as many single-stream blocks (19 and 38)."""
    return {**config, "num_layers": min(n, config["num_layers"]), "num_single_layers": min(2 * n, config["num_single_layers"])}


# transformer/config.json of lodestones/Chroma (diffusers format, as Chroma1-HD; the class defaults).
CONFIG = {
    "patch_size": 1,
    "in_channels": 64,
    "out_channels": None,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "axes_dims_rope": (16, 56, 56),
    "approximator_num_channels": 64,
    "approximator_hidden_dim": 5120,
    "approximator_layers": 5,
}
SMALL = {
    "in_channels": 16,
    "num_layers": 1,
    "num_single_layers": 2,
    "attention_head_dim": 8,
    "num_attention_heads": 2,
    "joint_attention_dim": 16,
    "axes_dims_rope": (2, 2, 4),
    "approximator_num_channels": 16,
    "approximator_hidden_dim": 32,
    "approximator_layers": 1,
}
FAMILY = Family(
    name="chroma",
    title="Chroma",
    timesteps=(1.0, 0.0),  # the pipeline passes timestep / 1000
    classes=("ChromaTransformer2DModel",),
    layout=layout,
    pipelines=("ChromaPipeline", "ChromaImg2ImgPipeline", "ChromaInpaintPipeline"),
    examples={"chroma": Example("ChromaTransformer2DModel", CONFIG, SMALL, inputs, 512, first_blocks)},
    notes="grid: img_ids (0, row, col), one host read per ids tensor; text: encoder_hidden_states at the root, first; "
    "single-stream blocks get [text; image] concatenated; rotary: image_rotary_emb (cos, sin) rows [text; image], "
    "gathered at each sample's kept positions; mask: attention_mask (B, T + N) float, (B, 1, S, S) at "
    "each attention, its rows and columns follow a merge, its columns follow downsampled keys",
    comfy=ComfyModel(
        ("Chroma",),
        "Chroma",
        notes="comfy/ldm/chroma: as Flux.1 (q, k, v (B, H, S, D) after the rotary embedding, [text; image])",
    ),
)
