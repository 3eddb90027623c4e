"""DreamLite (``DreamLiteUNetModel`` and its spatial transformer ``DreamLiteTransformer2DModel``): refused, with the reason.

Its blocks are ``BasicTransformerBlock``'s (some without self-attention), but its pipelines (``DreamLitePipeline``,
``DreamLiteMobilePipeline``) generate and edit in context: the UNet's latent is a diptych, the condition image (the
image to edit, zeros when generating) concatenated to the right of the target along the width. Every row of each
spatial transformer's token grid then holds target tokens followed by condition tokens: the condition image is no
contiguous segment that a token layout could keep whole, and merging or dropping its tokens would alter the image
being edited. ``DreamLiteTransformer2DModel`` exists only inside that UNet, so it is refused with it.
"""

from __future__ import annotations

from . import Family

FAMILY = Family(
    name="dreamlite",
    title="DreamLite",
    kind="unet",
    classes=("DreamLiteUNetModel", "DreamLiteTransformer2DModel"),
    pipelines=("DreamLitePipeline", "DreamLiteMobilePipeline"),
    refused="its latent is a diptych, the condition image concatenated to the right of the target along the width, so every "
    "row of its token grids holds target then condition tokens: the condition image is no contiguous segment a token layout "
    "can keep whole, and reducing its tokens would alter the image being edited",
)
