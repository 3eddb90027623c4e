"""Flux.3: per-mode ``Flux3ModeTransformerBlock``s (the text, the target image and the condition images each
through blocks of their own), then joint ``Flux3SingleTransformerBlock``s over [text; image; condition images].

Both block kinds run attention and MLP in parallel on one normalised sequence, as two modules fed the same tensor,
so each gets a span of its own (the same plan): the image mode blocks on the target image alone (its own rotary
table), the joint blocks on the joint sequence (one table, rows [text; image; conditions]). The condition images
(``image_cond_hidden_states``: references for edits) are their own segment, never reduced; the text and condition
mode blocks are left alone. Grid from ``img_ids`` (t, row/2, col/2, l): the width is the number of ids sharing the
first row's coordinate, one host read per ids tensor; text length from ``encoder_hidden_states``.
"""

from __future__ import annotations

from typing import Any

import torch

from ..algorithms import TokenGrid, TokenLayout
from . import Example, Family
from .base import Argument, BlockLayout, Container, DenoiserLayout, Follow, HostReads, KeyValueSite, Span, text_length


def _parallel_block(block: torch.nn.Module, stream: str, input_stream: str) -> BlockLayout:
    rotary = Follow("image_rotary_emb", dim=0, stream=stream)
    spans = [
        Span("merge_attn", block.attn, block.attn, stream=stream, follows=((block.attn, rotary),), name="attn"),
        Span("merge_mlp", block.ff, block.ff, stream=stream, name="ff"),
    ]
    return BlockLayout(
        block,
        spans,
        [KeyValueSite(block.attn, stream=stream)],
        input_stream=input_stream,
        kind=type(block).__name__,
    )


class Flux3Layout:
    """[text; image; condition images] of a Flux.3 call."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.ids, self.tokens = Argument(root, "img_ids"), Argument(root, "hidden_states")
        self.text, self.conditions = Argument(root, "encoder_hidden_states"), Argument(root, "image_cond_hidden_states")
        self.reads = HostReads()

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        ids, x = self.ids(args, kwargs), self.tokens(args, kwargs)
        if not isinstance(ids, torch.Tensor) or ids.ndim != 2 or not isinstance(x, torch.Tensor) or ids.shape[0] != x.shape[1]:
            return None
        grid = self.reads(ids, _grid)
        if grid is None:
            return None
        conditions = self.conditions(args, kwargs)
        references = (conditions.shape[1],) if isinstance(conditions, torch.Tensor) and conditions.shape[1] else ()
        return TokenLayout.joint(("text", "image", "reference"), grid, text_length(self.text(args, kwargs)), references)


def _grid(ids: torch.Tensor) -> TokenGrid | None:
    """The image grid of Flux.3's ids: its width is the number of ids sharing the first row's coordinate."""
    w = int((ids[:, 1] == ids[0, 1]).sum())
    return TokenGrid((ids.shape[0] // w, w)) if ids.shape[0] % w == 0 else None


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    modes = getattr(module, "mode_blocks", None)
    blocks = [_parallel_block(b, "target", "target") for b in (modes["image"] if modes is not None and "image" in modes else [])]
    blocks += [_parallel_block(b, "joint", "image") for b in getattr(module, "single_transformer_blocks", [])]
    return DenoiserLayout(module, [Container(module, blocks, 1, Flux3Layout(module))], "flux3", single_level=True) if blocks else None


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
FAMILY = Family(
    name="flux3",
    title="Flux.3",
    timesteps=(1.0, 0.0),  # the modular pipeline passes timestep / 1000
    classes=("Flux3Transformer2DModel",),
    layout=layout,
    pipelines=(),  # diffusers 0.42.1 runs Flux.3 through its modular pipeline only (modular_pipelines/flux3)
    examples={"flux3": Example("Flux3Transformer2DModel", CONFIG, SMALL, inputs, 512, first_blocks)},
    notes="grid: img_ids (t, row/2, col/2, l), width = ids sharing the first row, one host read per ids tensor; text: "
    "encoder_hidden_states, first; condition images: image_cond_hidden_states, after the image, never reduced; rotary: "
    "image_rotary_emb (cos, sin) per block kind (target only in the image mode blocks, [text; image; conditions] after)",
)
