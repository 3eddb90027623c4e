"""Flux.1 (dev, schnell, Kontext) and its ControlNets.

Double-stream ``FluxTransformerBlock``s as SD3 (but [text; image] in the joint attention), then single-stream
``FluxSingleTransformerBlock``s that concatenate [text; image] themselves and run attention and MLP in parallel
on one normalised sequence, merged from ``norm``'s output to ``proj_out``'s. Rotary positions are applied inside
the attention processor from one (cos, sin) table shared by the batch, text rows first: merged sequences get
that table gathered at each sample's kept positions (a merged token sits at its destination's position;
:class:`tokenmerge.hooks.tokens.SampleRows`). Grid and reference images (Kontext) from ``img_ids`` (t, row, col); text length from
``encoder_hidden_states``.
"""

from __future__ import annotations

from typing import Any

import torch

from . import Example, Family
from .base import ComfyModel, Container, DenoiserLayout, Follow, IdsLayout, joint_block, single_stream_block

ROTARY = Follow("image_rotary_emb", dim=0, stream="joint")


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [joint_block(b, follows=(ROTARY,)) for b in getattr(module, "transformer_blocks", [])]
    blocks += [single_stream_block(b, follows=(ROTARY,)) for b in getattr(module, "single_transformer_blocks", [])]
    reader = IdsLayout(module, ("text", "image", "reference"))
    return DenoiserLayout(module, [Container(module, blocks, 1, reader)], "flux", single_level=True) if blocks else None


def grid_ids(h: int, w: int, segment: float = 0.0, axes: int = 3) -> torch.Tensor:
    """Position ids of an h x w token grid as the Flux pipelines build them: (segment, row, col[, 0])."""
    ids = torch.zeros(h, w, axes)
    ids[..., 0] = segment
    ids[..., 1] = torch.arange(h)[:, None]
    ids[..., 2] = torch.arange(w)[None, :]
    return ids.reshape(h * w, axes)


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int) -> dict[str, Any]:
    """A Flux pipeline's call at a (height, width) latent: packed 2x2 patches, grid ids."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    h, w = height // 2, width // 2
    found = {
        "hidden_states": torch.randn(batch, h * w, config.in_channels, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.joint_attention_dim, generator=g).to(dtype),
        "timestep": torch.full((batch,), 0.5),
        "img_ids": grid_ids(h, w),
        "txt_ids": torch.zeros(text_tokens, 3),
    }
    if getattr(config, "pooled_projection_dim", None):
        found["pooled_projections"] = torch.randn(batch, config.pooled_projection_dim, generator=g).to(dtype)
    if getattr(config, "guidance_embeds", False):
        found["guidance"] = torch.full((batch,), 3.5)
    return found


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    """The first ``n`` double-stream blocks and twice as many single-stream blocks (Flux.1's proportion)."""
    return {**config, "num_layers": min(n, config["num_layers"]), "num_single_layers": min(2 * n, config["num_single_layers"])}


# transformer/config.json of black-forest-labs/FLUX.1-dev.
CONFIG = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": 768,
    "guidance_embeds": True,
    "axes_dims_rope": (16, 56, 56),
}
SMALL = {
    "num_layers": 1,
    "num_single_layers": 2,
    "attention_head_dim": 8,
    "num_attention_heads": 2,
    "joint_attention_dim": 16,
    "pooled_projection_dim": 8,
    "axes_dims_rope": (2, 2, 4),
}
FAMILY = Family(
    name="flux",
    title="Flux.1",
    timesteps=(1.0, 0.0),  # the pipeline passes timestep / 1000
    classes=("FluxTransformer2DModel", "FluxControlNetModel", "FluxMultiControlNetModel"),
    layout=layout,
    pipelines=("FluxPipeline", "FluxKontextPipeline", "FluxControlNetPipeline", "FluxImg2ImgPipeline", "FluxFillPipeline"),
    examples={"flux": Example("FluxTransformer2DModel", CONFIG, SMALL, inputs, 512, first_blocks)},
    notes="grid and Kontext references: img_ids (t, row, col), one host read per ids tensor; text: encoder_hidden_states, "
    "first; rotary: image_rotary_emb (cos, sin) rows [text; image], gathered at the kept positions (each sample's own)",
    comfy=ComfyModel(
        ("Flux",),
        "Flux.1",
        image_models=("flux",),
        notes="comfy/ldm/flux: q, k, v (B, H, S, D) after the rotary embedding, [text; image; Kontext references] in the "
        "double- and single-stream blocks",
    ),
)
