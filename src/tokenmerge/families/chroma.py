"""Chroma (lodestones/Chroma, Chroma1-HD): Flux.1 with one modulation network for all blocks and a text mask.

Double-stream ``ChromaTransformerBlock``s as Flux.1's: [text; image] in the joint attention, whose image output
is element 0; the image stream is merged around the attention and around ``ff``. Then
``ChromaSingleTransformerBlock``s, which get [text; image] already concatenated by the root (their
``hidden_states`` is the joint sequence) and run attention and MLP in parallel on one normalised sequence,
merged from ``norm``'s output (element 0) to ``proj_out``'s.

Grid (and any reference images) from ``img_ids`` (0, row, col), one host read per ids tensor; text length from
the root's ``encoder_hidden_states``. Rotary: one (cos, sin) table shared by the batch, rows [text; image],
applied inside the processor: each sample's rows are gathered at its kept positions (hooks.tokens.SampleRows).

Mask: the pipeline passes ``attention_mask`` (B, T + N), float 0/1 (text after the first padding token 0, image
1); each block turns it into (B, 1, S, S) and hands it to its attention as ``attention_mask``. A merge gathers
its rows and its columns at the kept positions (declared as two follows of the joint stream); downsampled keys
take their mask columns at ``dispatch_attention_fn`` (which needs a nearest ``kv_interpolation``, the default:
with another one the keys of a masked call are left whole, with a warning). The float mask is kept as the
pipeline made it (diffusers adds it to the logits); a merge only selects its entries.
"""

from __future__ import annotations

import torch

from . import Family
from .base import ComfyModel, Container, DenoiserLayout, Follow, IdsLayout, joint_block, single_stream_block
from .flux import COMFY_BLOCKS

ROTARY = Follow("image_rotary_emb", dim=0, stream="joint")
MASK = (Follow("attention_mask", dim=-1, stream="joint"), Follow("attention_mask", dim=-2, stream="joint"))
FOLLOWS = (ROTARY, *MASK)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [joint_block(b, follows=FOLLOWS) for b in getattr(module, "transformer_blocks", [])]
    blocks += [single_stream_block(b, input_stream="joint", follows=FOLLOWS) for b in getattr(module, "single_transformer_blocks", [])]
    reader = IdsLayout(module, ("text", "image", "reference"))
    return DenoiserLayout(module, [Container(module, blocks, 1, reader)], "chroma", single_level=True) if blocks else None


FAMILY = Family(
    name="chroma",
    title="Chroma",
    timesteps=(1.0, 0.0),  # the pipeline passes timestep / 1000
    classes=("ChromaTransformer2DModel",),
    layout=layout,
    pipelines=("ChromaPipeline", "ChromaImg2ImgPipeline", "ChromaInpaintPipeline"),
    notes="grid: img_ids (0, row, col), one host read per ids tensor; text: encoder_hidden_states at the root, first; "
    "single-stream blocks get [text; image] concatenated; rotary: image_rotary_emb (cos, sin) rows [text; image], "
    "gathered at each sample's kept positions; mask: attention_mask (B, T + N) float, (B, 1, S, S) at "
    "each attention, its rows and columns follow a merge, its columns follow downsampled keys",
    comfy=ComfyModel(
        ("Chroma",),
        "Chroma",
        notes="comfy/ldm/chroma: as Flux.1 (q, k, v (B, H, S, D) after the rotary embedding, [text; image])",
        blocks=COMFY_BLOCKS,
    ),
)
