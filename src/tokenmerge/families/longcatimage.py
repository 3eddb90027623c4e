"""LongCat-Image (text-to-image and LongCat-Image-Edit): Flux.1's transformer with Qwen2.5-VL text.

Double-stream ``LongCatImageTransformerBlock``s as Flux.1's: [text; image] in the joint attention, whose image output
is element 0; the image stream is merged around ``attn`` and around ``ff``. Then
``LongCatImageSingleTransformerBlock``s that concatenate [text; image] themselves and run attention and MLP in
parallel on one normalised sequence, merged from ``norm``'s output (element 0) to ``proj_out``'s.

Grid from ``img_ids`` (modality, row, col): the target is modality 1, its rows and columns offset past the text's
(which runs along the diagonal, modality 0); the edit pipeline appends its reference image after the target, in
``hidden_states`` and ``img_ids``, as modality 2: a segment of its own, never reduced. One host read per ids tensor.
Text length from ``encoder_hidden_states`` (no mask: padded to 512 tokens). Rotary: one (cos, sin) table shared by
the batch, rows [text; image; reference], applied inside the processor: merged sequences get each sample's rows
gathered at its kept positions. Keys and values (todo/auto) are reduced at the dispatch call, after the rotary
embedding.
"""

from __future__ import annotations

import torch

from . import Family
from .base import Container, DenoiserLayout, Follow, IdsLayout, joint_block, single_stream_block

ROTARY = Follow("image_rotary_emb", dim=0, stream="joint")


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [joint_block(b, follows=(ROTARY,)) for b in getattr(module, "transformer_blocks", [])]
    blocks += [single_stream_block(b, follows=(ROTARY,)) for b in getattr(module, "single_transformer_blocks", [])]
    reader = IdsLayout(module, ("text", "image", "reference"))
    return DenoiserLayout(module, [Container(module, blocks, 1, reader)], "longcat-image", single_level=True) if blocks else None


FAMILY = Family(
    name="longcat-image",
    title="LongCat-Image",
    timesteps=(1.0, 0.0),  # the pipelines pass timestep / 1000
    classes=("LongCatImageTransformer2DModel",),
    layout=layout,
    pipelines=("LongCatImagePipeline", "LongCatImageEditPipeline"),
    notes="grid and the edit's reference: img_ids (modality, row, col), the target modality 1, the reference after it "
    "(modality 2), one host read per ids tensor; text: encoder_hidden_states, first; rotary: image_rotary_emb (cos, "
    "sin) rows [text; image; reference], gathered at each sample's kept positions",
)
