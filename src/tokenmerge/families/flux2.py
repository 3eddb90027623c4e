"""Flux.2 (dev, klein): ``Flux2TransformerBlock``s (dual stream, [text; image] in the joint attention), then
``Flux2SingleTransformerBlock``s that get [text; image] already concatenated (``encoder_hidden_states=None``) and
run a parallel self-attention whose MLP is fused into the attention module.

Reference images (multi-reference edits) are appended after the target in ``hidden_states`` and ``img_ids``, with
their own t coordinate (10, 20, ...): they are segments of their own, never reduced. Grid from ``img_ids`` (t, row,
col, l); text length from ``encoder_hidden_states`` at the root. Rotary: one (cos, sin) table shared by the batch,
rows [text; image; references], applied inside the processors (keys and values are downsampled after it, so kept
keys keep their exact positions; a merged token takes its destination's rows, each sample its own). The Klein-KV pipeline's cached calls
(``kv_cache_mode``) carry reference keys and values outside the sequence: they run unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

from ..algorithms import TokenLayout
from ..notices import warn_at_caller
from . import Example, Family
from .base import DECLINED, Argument, ComfyModel, Container, DenoiserLayout, Follow, IdsLayout, fused_parallel_block, joint_block

ROTARY = Follow("image_rotary_emb", dim=0, stream="joint")


class Flux2Layout(IdsLayout):
    """Flux.1's ids reader, except calls with a key/value cache (Klein-KV), whose sequences are not the ids'."""

    def __init__(self, root: torch.nn.Module) -> None:
        super().__init__(root, ("text", "image", "reference"))
        self.cache_mode = Argument(root, "kv_cache_mode")

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        if self.cache_mode(args, kwargs) is not None:
            if not self.warned:
                self.warned = True
                warn_at_caller("tokenmerge: Flux.2 calls with a key/value cache (kv_cache_mode) run unchanged")
            return DECLINED
        return super().__call__(args, kwargs)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [joint_block(b, follows=(ROTARY,)) for b in getattr(module, "transformer_blocks", [])]
    blocks += [fused_parallel_block(b, follows=(ROTARY,)) for b in getattr(module, "single_transformer_blocks", [])]
    return DenoiserLayout(module, [Container(module, blocks, 1, Flux2Layout(module))], "flux2", single_level=True) if blocks else None


def grid_ids(h: int, w: int, t: int = 0) -> torch.Tensor:
    """(t, row, col, l) ids of an h x w grid, as the Flux.2 pipeline builds them (int64)."""
    return torch.cartesian_prod(torch.tensor([t]), torch.arange(h), torch.arange(w), torch.arange(1))


def inputs(
    model: torch.nn.Module,
    height: int,
    width: int,
    batch: int,
    seed: int,
    text_tokens: int,
    references: tuple[tuple[int, int], ...] = (),
) -> dict[str, Any]:
    """The Flux.2 pipeline's call at a (height, width) latent (packed 2x2 patches), with optional reference images
    (their token grids), appended after the target as the edit pipeline does."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    h, w = height // 2, width // 2
    tokens = [torch.randn(batch, h * w, config.in_channels, generator=g)]
    ids = [grid_ids(h, w)]
    for i, (rh, rw) in enumerate(references):
        tokens.append(torch.randn(1, rh * rw, config.in_channels, generator=g).expand(batch, -1, -1))
        ids.append(grid_ids(rh, rw, 10 + 10 * i))
    text_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(text_tokens))
    found = {
        "hidden_states": torch.cat(tokens, 1).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.joint_attention_dim, generator=g).to(dtype),
        "timestep": torch.full((batch,), 0.5),
        "img_ids": torch.cat(ids).expand(batch, -1, -1),
        "txt_ids": text_ids.expand(batch, -1, -1),
    }
    if config.guidance_embeds:
        found["guidance"] = torch.full((batch,), 4.0)
    return found


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    """The first ``n`` double-stream and ``n`` single-stream blocks (FLUX.2-dev has 8 and 48; at full width one of
    each is 1.5 B parameters, what a 24 GiB machine can time)."""
    return {**config, "num_layers": min(n, config["num_layers"]), "num_single_layers": min(n, config["num_single_layers"])}


# transformer/config.json of black-forest-labs/FLUX.2-dev (the class defaults).
CONFIG = {
    "patch_size": 1,
    "in_channels": 128,
    "num_layers": 8,
    "num_single_layers": 48,
    "attention_head_dim": 128,
    "num_attention_heads": 48,
    "joint_attention_dim": 15360,
    "timestep_guidance_channels": 256,
    "axes_dims_rope": (32, 32, 32, 32),
    "guidance_embeds": True,
}
SMALL = {
    "in_channels": 4,
    "num_layers": 1,
    "num_single_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "joint_attention_dim": 32,
    "axes_dims_rope": (4, 4, 4, 4),
}
FAMILY = Family(
    name="flux2",
    title="Flux.2",
    timesteps=(1.0, 0.0),  # the pipeline passes timestep / 1000
    classes=("Flux2Transformer2DModel",),
    layout=layout,
    pipelines=("Flux2Pipeline", "Flux2KleinPipeline"),
    examples={"flux2": Example("Flux2Transformer2DModel", CONFIG, SMALL, inputs, 512, first_blocks)},
    notes="grid and references: img_ids (t, row, col, l), references after the target (t = 10, 20, ...), one host read "
    "per ids tensor; text: encoder_hidden_states at the root, first; single-stream blocks get [text; image] concatenated; "
    "rotary: image_rotary_emb (cos, sin) rows [text; image; references]",
    comfy=ComfyModel(
        ("Flux",),
        "Flux.2",
        patch=(1, 1),
        image_models=("flux2",),
        notes="comfy/ldm/flux (ComfyUI >= 0.4, image_model flux2): 1x1 patches of a 128-channel latent; q, k, v (B, H, S, D) "
        "after the rotary embedding, [text; image; reference latents]",
    ),
)
