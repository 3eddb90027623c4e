"""ChronoEdit (image editing as a short video): Wan 2.1 I2V's video DiT, laid out as :mod:`.wan` lays Wan out.

``ChronoEditTransformer3DModel`` is Wan 2.1's model with its ``WanTransformerBlock`` copied unchanged (self-attention
``attn1`` with Wan's 3-D rotary ``(cos, sin)``, cross-attention ``attn2`` to the umT5 text and the CLIP image tokens,
MLP ``ffn``) and the same root arguments; only its rotary table differs (two latent frames, the input image and the
edit, sit ``rope_temporal_skip_len`` frames apart), which changes no row order.

Token layout, read at the root without a host sync (Wan's reader):

- grid: ``hidden_states`` (B, C, F, H, W) over ``patch_size`` (1, 2, 2), frame-major. The input image conditions by
  channels (its latent and a mask concatenated to C, as Wan 2.1 I2V): every token is generated, the first frame's
  included. The pipeline passes 2 latent frames (5 video frames; 8 with temporal reasoning for its first steps).
- text: cross-attention only (``attn2``), the CLIP image tokens before it: neither is reduced.
- rotary: ``rotary_emb = (cos, sin)``, each (1, N, 1, D), gathered at each sample's kept rows.

Keys and values (todo/auto) are reduced at ``dispatch_attention_fn`` in ``attn1``, after the rotary embedding.
"""

from __future__ import annotations

import dataclasses

import torch

from . import Family
from .base import DenoiserLayout
from .wan import layout as wan_layout
from .wan import pixels


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    found = wan_layout(module)
    return None if found is None else dataclasses.replace(found, family="chronoedit")


FAMILY = Family(
    name="chronoedit",
    title="ChronoEdit",
    px=pixels,
    classes=("ChronoEditTransformer3DModel",),
    layout=layout,
    pipelines=("ChronoEditPipeline",),
    cross_attention=True,
    notes="Wan 2.1 I2V's layout: grid: hidden_states (B, C, F, H, W) / patch_size (1, 2, 2), frame-major, the input image "
    "by channels; text and CLIP image tokens: cross-attention (attn2) only; rotary: rotary_emb (cos, sin), each "
    "(1, N, 1, D), gathered at each sample's kept rows",
)
