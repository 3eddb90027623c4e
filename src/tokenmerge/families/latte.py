"""Latte (maxin-cn/Latte-1): a video DiT of spatial and temporal ``BasicTransformerBlock``s in turn, PixArt-α's blocks.

``transformer_blocks`` (spatial): self-attention over one frame's tokens, cross-attention to the T5 text (``attn2``)
and MLP, on the video reshaped to (B * F, h * w, C): every frame is a sample of its own, as an image in
:mod:`.pixart`, and is merged around each sub-layer (``basic_block``); each frame is matched on its own tokens (the
random destinations of ToMe's partition, drawn from the timestep, are the same for a sample's frames).

``temporal_transformer_blocks``: self-attention and MLP over the frames of one spatial position, on (B * h * w, F, C):
left whole. Their sequences are the F latent frames (16 in the pipeline), too short for a reduction to save anything,
and a merge across frames would mix what the spatial blocks keep apart per frame.

Token layout, read at the root without a host sync:

- grid: ``hidden_states`` (B, C, F, H, W) over ``patch_size``: each frame's (h, w) grid, the one the spatial blocks
  see (so the family's grids have no frame axis: ``st`` and a (t, h, w) ``kv_factor`` act on the spatial sides only).
- text: cross-attention only (``attn2``), never reduced.
- positions: 2-D sin-cos embeddings added at the patch embedding and the temporal ones before the first temporal
  block, all outside the merged spans: nothing follows a merge.

Keys and values (todo/auto) are reduced in the spatial self-attention (``attn1``), handed to it as its key/value
source.
"""

from __future__ import annotations

import torch

from ..algorithms import TokenGrid, TokenLayout
from . import Family
from .base import Argument, Container, DenoiserLayout, basic_block, has_class_named


class FrameGrid:
    """Each frame's (h, w) token grid of a (B, C, F, H, W) ``hidden_states`` over the spatial ``patch``."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.tokens, self.patch = Argument(root, "hidden_states"), root.config.patch_size

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        x, p = self.tokens(args, kwargs), self.patch
        if not isinstance(x, torch.Tensor) or x.ndim != 5:
            return None
        return TokenLayout.image_only(TokenGrid((x.shape[3] // p, x.shape[4] // p), patch=(p, p)))


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [basic_block(b) for b in getattr(module, "transformer_blocks", []) if has_class_named(b, "BasicTransformerBlock")]
    return DenoiserLayout(module, [Container(module, blocks, 1, FrameGrid(module))], "latte", single_level=True) if blocks else None


FAMILY = Family(
    name="latte",
    title="Latte",
    classes=("LatteTransformer3DModel",),
    layout=layout,
    pipelines=("LattePipeline",),
    cross_attention=True,
    notes="grid: each frame's hidden_states (B, C, F, H, W) / patch_size, the spatial blocks' (B * F, h * w) samples; the "
    "temporal blocks (over F frames per position) left whole; text: cross-attention (attn2) only",
)
