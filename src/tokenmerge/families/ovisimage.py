"""Ovis-Image: Flux.1's transformer with SwiGLU MLPs and Ovis 2.5 text.

Double-stream ``OvisImageTransformerBlock``s as Flux.1's: [text; image] in the joint attention, whose image output is
element 0; the image stream is merged around ``attn`` and around ``ff``. Then ``OvisImageSingleTransformerBlock``s
that concatenate [text; image] themselves and run attention and a gated MLP in parallel on one normalised sequence,
merged from ``norm``'s output (element 0) to ``proj_out``'s.

Grid from ``img_ids`` (0, row, col), one host read per ids tensor; text length from ``encoder_hidden_states`` (256
tokens, padding zeroed by the pipeline: no mask). Rotary: one (cos, sin) table shared by the batch, rows [text;
image] (the text along the diagonal), applied inside the processor: merged sequences get each sample's rows gathered
at its kept positions. Keys and values (todo/auto) are reduced at the dispatch call, after the rotary embedding.
"""

from __future__ import annotations

import torch

from . import Family
from .base import Container, DenoiserLayout, Follow, IdsLayout, joint_block, single_stream_block

ROTARY = Follow("image_rotary_emb", dim=0, stream="joint")


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [joint_block(b, follows=(ROTARY,)) for b in getattr(module, "transformer_blocks", [])]
    blocks += [single_stream_block(b, follows=(ROTARY,)) for b in getattr(module, "single_transformer_blocks", [])]
    reader = IdsLayout(module, ("text", "image"))
    return DenoiserLayout(module, [Container(module, blocks, 1, reader)], "ovis-image", single_level=True) if blocks else None


FAMILY = Family(
    name="ovis-image",
    title="Ovis-Image",
    timesteps=(1.0, 0.0),  # the pipeline passes timestep / 1000
    classes=("OvisImageTransformer2DModel",),
    layout=layout,
    pipelines=("OvisImagePipeline",),
    notes="grid: img_ids (0, row, col), one host read per ids tensor; text: encoder_hidden_states, first; rotary: "
    "image_rotary_emb (cos, sin) rows [text; image], gathered at each sample's kept positions",
)
