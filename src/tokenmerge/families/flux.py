"""Flux.1 (dev, schnell, Kontext) and its ControlNets.

Double-stream ``FluxTransformerBlock``s as SD3 (but [text; image] in the joint attention), then single-stream
``FluxSingleTransformerBlock``s that concatenate [text; image] themselves and run attention and MLP in parallel
on one normalised sequence, merged from ``norm``'s output to ``proj_out``'s. Rotary positions are applied inside
the attention processor from one (cos, sin) table shared by the batch, text rows first: merged sequences get
that table gathered at each sample's kept positions (a merged token sits at its destination's position;
:class:`tokenmerge.hooks.tokens.SampleRows`). Grid and reference images (Kontext) from ``img_ids`` (t, row, col); text length from
``encoder_hidden_states``.
"""

from __future__ import annotations

import torch

from . import Family
from .base import ComfyBlocks, ComfyModel, Container, DenoiserLayout, Follow, IdsLayout, joint_block, single_stream_block

ROTARY = Follow("image_rotary_emb", dim=0, stream="joint")
# ComfyUI's comfy/ldm/flux (Flux.1, Flux.2) and comfy/ldm/chroma: double blocks on [image; references] with the text
# beside them, single blocks on [text; image; references]; pe (B, 1, S, D/2, 2, 2), rows [text; image; references]
COMFY_BLOCKS = ComfyBlocks((("double_block", "double_blocks"), ("single_block", "single_blocks")), joint=("single_block",), pe_dims=(2,))


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [joint_block(b, follows=(ROTARY,)) for b in getattr(module, "transformer_blocks", [])]
    blocks += [single_stream_block(b, follows=(ROTARY,)) for b in getattr(module, "single_transformer_blocks", [])]
    reader = IdsLayout(module, ("text", "image", "reference"))
    return DenoiserLayout(module, [Container(module, blocks, 1, reader)], "flux", single_level=True) if blocks else None


FAMILY = Family(
    name="flux",
    title="Flux.1",
    timesteps=(1.0, 0.0),  # the pipeline passes timestep / 1000
    classes=("FluxTransformer2DModel", "FluxControlNetModel", "FluxMultiControlNetModel"),
    layout=layout,
    pipelines=("FluxPipeline", "FluxKontextPipeline", "FluxControlNetPipeline", "FluxImg2ImgPipeline", "FluxFillPipeline"),
    notes="grid and Kontext references: img_ids (t, row, col), one host read per ids tensor; text: encoder_hidden_states, "
    "first; rotary: image_rotary_emb (cos, sin) rows [text; image], gathered at the kept positions (each sample's own)",
    comfy=ComfyModel(
        ("Flux",),
        "Flux.1",
        image_models=("flux",),
        blocks=COMFY_BLOCKS,
        notes="comfy/ldm/flux: q, k, v (B, H, S, D) after the rotary embedding, [text; image; Kontext references] in the "
        "double- and single-stream blocks",
    ),
)
