"""Wan Animate 2 (``WanAnimate2Transformer3DModel``): refused, with the reason.

Its generation self-attention (``WanAnimate2AttnProcessor``) attends to keys and values cached by an earlier call:
a reference pass (``kv_cache_mode="extract"``) stores each block's projected reference keys and values in a
``WanAnimate2KVCache``, and every denoising call (``"cached"``) scatters its own tokens, frame by frame at the full
video's frame size, into a buffer padded to 128 that a flex-attention ``BlockMask`` built for the full resolution
indexes, beside those cached keys. A merged or reduced sequence would no longer fill that buffer's frames, nor line
up with the mask's blocks or the keys cached from the reference pass, so tokenmerge declines rather than patch it.
"""

from __future__ import annotations

from . import Family

FAMILY = Family(
    name="wan-animate-2",
    title="Wan Animate 2",
    classes=("WanAnimate2Transformer3DModel",),
    refused="its self-attention reads reference keys and values cached by an earlier call (kv_cache, extract then cached) "
    "and packs each frame's tokens into a buffer indexed by a flex-attention BlockMask built for the full frame size: a "
    "merged or reduced sequence would not fill its frames nor line up with the mask or the cached keys",
)
