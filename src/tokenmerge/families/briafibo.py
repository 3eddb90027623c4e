"""Bria FIBO (text-to-image and FIBO Edit): Flux.1's blocks fed one text-encoder layer per block.

Double-stream ``BriaFiboTransformerBlock``s as Flux.1's: [text; image] in the joint attention, whose image output is
element 0; the image stream is merged around ``attn`` and around ``ff``. Then ``BriaFiboSingleTransformerBlock``s,
which get [text; image] already concatenated by the root (their ``hidden_states`` is the joint sequence) and run
attention and MLP in parallel on one normalised sequence, merged from ``norm``'s output (element 0) to
``proj_out``'s. Before each block the root rebuilds the text from half of it and that block's projected
``text_encoder_layers`` entry: the text's length never changes.

Grid from ``img_ids`` (0, row, col), 1x1 patches of the 16x VAE's latent; FIBO Edit appends its reference images
after the target, in ``hidden_states`` and ``img_ids``, each on its own first coordinate (1, 2, ...): segments of
their own, never reduced. One host read per ids tensor. Text length from the root's ``encoder_hidden_states``.
Rotary: one (cos, sin) table shared by the batch, rows [text; image; references], applied inside the processors:
merged sequences get each sample's rows gathered at its kept positions.

Mask: where a prompt is padded (a negative prompt of another length), the pipelines pass
``joint_attention_kwargs={"attention_mask": (B, 1, 1, T + N)}`` (bool), which every block hands to its attention:
its key columns follow a merge of the joint stream, and downsampled keys (todo/auto) take theirs at the dispatch
call, after the rotary embedding.
"""

from __future__ import annotations

import torch

from . import Family
from .base import Container, DenoiserLayout, Follow, IdsLayout, joint_block, single_stream_block

FOLLOWS = (Follow("image_rotary_emb", dim=0, stream="joint"), Follow("attention_mask", dim=-1, stream="joint"))


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [joint_block(b, follows=FOLLOWS) for b in getattr(module, "transformer_blocks", [])]
    blocks += [single_stream_block(b, input_stream="joint", follows=FOLLOWS) for b in getattr(module, "single_transformer_blocks", [])]
    reader = IdsLayout(module, ("text", "image", "reference"))
    return DenoiserLayout(module, [Container(module, blocks, 1, reader)], "bria-fibo", single_level=True) if blocks else None


FAMILY = Family(
    name="bria-fibo",
    title="Bria FIBO",
    classes=("BriaFiboTransformer2DModel",),
    layout=layout,
    pipelines=("BriaFiboPipeline", "BriaFiboEditPipeline"),
    notes="grid and FIBO Edit references: img_ids (plane, row, col), references after the target (plane 1, 2, ...), one "
    "host read per ids tensor; text: encoder_hidden_states at the root, first; single-stream blocks get [text; image] "
    "concatenated; rotary: image_rotary_emb (cos, sin) rows [text; image; references], gathered at each sample's kept "
    "positions; mask: joint_attention_kwargs' attention_mask (B, 1, 1, T + N) where a prompt is padded, its columns "
    "follow a merge and downsampled keys",
)
