"""Wan 2.2 Animate (character animation and replacement): Wan 2.1 I2V's video DiT with pose and face conditioning.

``WanAnimateTransformer3DModel``: Wan's ``WanTransformerBlock`` (copied unchanged; merged and reduced as :mod:`.wan`
does it: ``attn1`` with Wan's 3-D rotary ``(cos, sin)``, ``attn2`` to the umT5 text and the CLIP tokens of the
character image, ``ffn``). The pose latents are added to the patch embedding of every frame but the first, before
the blocks; the face adapters (``face_adapter``: a cross-attention of each latent frame's tokens to that frame's
face-motion tokens) run between blocks on the whole sequence, outside any merged span, and are left alone.

Token layout, read at the root without a host sync:

- grid: ``hidden_states`` (B, C, 1 + F, H, W) over ``patch_size`` (1, 2, 2), frame-major. Its first latent frame is
  the reference slot: the character image's latent sits beside it in the channels and the pipeline drops its
  prediction. In every call it is a reference segment, never reduced; the F frames after it (the segment's video)
  are the target.
- text: cross-attention only (``attn2``), the CLIP image tokens before it: neither is reduced.
- rotary: ``rotary_emb = (cos, sin)``, each (1, N, 1, D), gathered at each sample's kept rows.

Keys and values (todo/auto) are reduced at ``dispatch_attention_fn`` in ``attn1``, after the rotary embedding.
"""

from __future__ import annotations

import torch

from . import Family
from .base import Argument, Container, DenoiserLayout, VideoGrid, self_cross_block
from .wan import OUTPUT, ROTARY, pixels


class ReferenceSlot:
    """Wan Animate's first latent frame is the character's reference slot, in every call."""

    def __call__(self, args: tuple, kwargs: dict) -> bool:
        return True


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [self_cross_block(b, follows=(ROTARY,), output=OUTPUT) for b in getattr(module, "blocks", None) or []]
    if not blocks:
        return None
    reader = VideoGrid(tuple(module.config.patch_size), Argument(module, "hidden_states"), ReferenceSlot())
    return DenoiserLayout(module, [Container(module, blocks, 1, reader)], "wan-animate", single_level=True)


FAMILY = Family(
    name="wan-animate",
    title="Wan 2.2 Animate",
    px=pixels,
    classes=("WanAnimateTransformer3DModel",),
    layout=layout,
    pipelines=("WanAnimatePipeline",),
    cross_attention=True,
    notes="grid: hidden_states (B, C, 1 + F, H, W) / patch_size (1, 2, 2), frame-major; the first latent frame (the "
    "character's reference slot) is a reference in every call; text and CLIP image tokens: cross-attention (attn2) "
    "only; rotary: rotary_emb (cos, sin), each (1, N, 1, D), gathered at each sample's kept rows; face adapters "
    "between blocks left alone",
)
