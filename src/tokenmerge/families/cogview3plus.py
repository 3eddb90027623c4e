"""CogView3-Plus (CogView3-Plus-3B): CogVideoX's joint-attention blocks over [text; image].

``CogView3PlusTransformerBlock`` is CogVideoX's block on images (:mod:`.cogvideox`, whose layout it reuses): one
joint attention (``attn1``, CogVideoX's processor) takes the image and the text separately, concatenates [text;
image] and returns ``(image, text)``; the MLP (``ff``) then runs on the concatenated [text; image] sequence. Merged:
the image stream around ``attn1``, and the image segment of the joint sequence around ``ff``.

Token layout, read at the root:

- grid: ``hidden_states`` (B, C, H, W) over ``patch_size``.
- text: ``encoder_hidden_states`` (224 T5 tokens), first in the joint sequence, never reduced.
- positions: sin-cos, added at the patch embedding (before any merge); no rotary table, no mask.

Keys and values (todo/auto) are reduced at SDPA.
"""

from __future__ import annotations

import torch

from . import Family
from .base import Argument, Container, DenoiserLayout, ImageGrid, config_int
from .cogvideox import block


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [block(b) for b in getattr(module, "transformer_blocks", [])]
    grid = ImageGrid(config_int(module, "patch_size", 2), Argument(module, "encoder_hidden_states"), ("text", "image"))
    return DenoiserLayout(module, [Container(module, blocks, 1, grid)], "cogview3plus", single_level=True) if blocks else None


FAMILY = Family(
    name="cogview3plus",
    title="CogView3-Plus",
    classes=("CogView3PlusTransformer2DModel",),
    layout=layout,
    pipelines=("CogView3PlusPipeline",),
    notes="grid: hidden_states (B, C, H, W) / patch_size; text: encoder_hidden_states, first in the joint sequence; "
    "positions: absolute, added at the patch embedding",
)
