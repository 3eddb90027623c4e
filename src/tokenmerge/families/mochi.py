"""Mochi (genmo/mochi-1-preview): refused, with the reason.

``MochiTransformerBlock``'s joint attention (``MochiAttnProcessor2_0``) drops each sample's padded text tokens itself:
it calls SDPA once per sample on [video; that sample's valid text tokens], so its keys have another length in every
sample (and than the call's padded text), which no token layout describes; key/value downsampling cannot find the
video segment's end. Its rotary table ((cos, sin), each (N, H, D/2), no batch dimension) is applied by a plain product
broadcast against the batch, where a merge cannot hand each sample its own kept positions. Both are the model's
ordinary path (the pipeline pads the T5 prompt to 256 tokens and passes the mask), so tokenmerge declines rather than
patch it with a guessed layout.
"""

from __future__ import annotations

from . import Family

FAMILY = Family(
    name="mochi",
    title="Mochi",
    classes=("MochiTransformer3DModel",),
    pipelines=("MochiPipeline",),
    refused="its joint attention runs SDPA once per sample on [video; that sample's unpadded text tokens] (keys of "
    "another length in every sample, which no token layout describes) and applies its rotary table by a product broadcast "
    "against the batch, where merged samples cannot each get their own positions",
)
