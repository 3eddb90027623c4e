"""Kandinsky 6 (text/image-to-video-and-audio, and its video super-resolution model): refused, each with the reason.

``Kandinsky6Transformer3DModel``: text encoder blocks (one stack per modality), then fused video/audio decoder blocks
(``Kandinsky6FusedTransformerDecoderBlock``): video self-attention, cross-attention to the text, video<->audio
cross-attentions and an MLP. Its video rotary table ((N, 1, D/2, 2, 2), no batch dimension) reaches the
self-attention as ``rotary_emb`` and is applied by a plain product broadcast against the (B, N, H, D) queries and keys
(``apply_rotary``: ``rope.float() * x``): a merge cannot hand each sample its own kept positions there (the table
has room for one row order), so merged tokens would take the first sample's positions in every sample. Key/value
downsampling alone would work; the family is refused rather than supported by half.

``Kandinsky6SRTransformer3DModel``: its self-attention is always NABLA block-sparse: a flex-attention ``BlockMask``
over 64-token blocks (8x8 tiles of the grid, reordered "fractally"), chosen from the queries' and keys' block means
and a sliding-tile prior. A merged or reduced sequence no longer fills those blocks, nor lines up with the prior.
"""

from __future__ import annotations

from . import Family

FAMILIES = (
    Family(
        name="kandinsky6",
        title="Kandinsky 6",
        classes=("Kandinsky6Transformer3DModel",),
        pipelines=("Kandinsky6TI2VAPipeline",),
        refused="its video rotary table has no batch dimension and is applied by a product broadcast against the batch "
        "(apply_rotary), where merged samples cannot each get their own positions",
    ),
    Family(
        name="kandinsky6-sr",
        title="Kandinsky 6 SR",
        classes=("Kandinsky6SRTransformer3DModel",),
        pipelines=("Kandinsky6SRPipeline",),
        refused="its self-attention is always NABLA block-sparse (a flex-attention BlockMask over 64-token blocks of 8x8 "
        "tiles in a reordered sequence): a merged or reduced sequence no longer fills those blocks",
    ),
)
