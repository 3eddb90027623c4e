"""Allegro (rhymes-ai/Allegro): a video DiT of self+cross blocks.

``AllegroTransformerBlock``: self-attention (``attn1``, with Allegro's 3-D rotary embedding), cross-attention
(``attn2``) to the T5 text and MLP (``ff``), on the video tokens alone, each merged around itself after the block's
modulation and before its gate.

Token layout, read at the root without a host sync:

- grid: ``hidden_states`` (B, C, F, H, W) over (``patch_size_t``, ``patch_size``, ``patch_size``): a (frames, h, w)
  grid, frame-major.
- text: cross-attention only (``attn2``), never reduced.
- rotary: ``image_rotary_emb = ((t, h, w) (cos, sin) tables, (t, h, w) positions)``, computed by the pipeline: the
  tables are indexed by each token's positions, three (1, N) rows; those rows follow the merge (gathered at each
  sample's kept rows, a batch dimension then given to them), the tables stay whole.

Keys and values (todo/auto) are reduced at SDPA in ``attn1``, after the rotary embedding.
"""

from __future__ import annotations

import torch

from . import Family
from .base import Argument, Container, DenoiserLayout, Follow, VideoGrid, self_cross_block

POSITIONS = Follow("image_rotary_emb", dim=1, stream="image", element=1)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [
        self_cross_block(b, names=("attn1", "attn2", "ff"), follows=(POSITIONS,))
        for b in getattr(module, "transformer_blocks", [])
        if isinstance(getattr(b, "attn1", None), torch.nn.Module)
    ]
    if not blocks:
        return None
    config = module.config
    reader = VideoGrid((config.patch_size_t, config.patch_size, config.patch_size), Argument(module, "hidden_states"))
    return DenoiserLayout(module, [Container(module, blocks, 1, reader)], "allegro", single_level=True)


FAMILY = Family(
    px=(16, 4),
    name="allegro",
    title="Allegro",
    classes=("AllegroTransformer3DModel",),
    layout=layout,
    pipelines=("AllegroPipeline",),
    cross_attention=True,
    notes="grid: hidden_states (B, C, F, H, W) / (patch_size_t, patch_size, patch_size), frame-major; text: "
    "cross-attention (attn2) only; rotary: the (t, h, w) position rows of image_rotary_emb, each (1, N), gathered at "
    "each sample's kept rows",
)
