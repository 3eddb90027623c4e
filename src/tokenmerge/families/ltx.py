"""LTX-Video (0.9.x; text-, image- and condition-to-video): self+cross video DiT blocks over packed tokens.

``LTXVideoTransformerBlock``: self-attention (``attn1``, the 3-D rotary table as ``image_rotary_emb``), cross-attention
to the T5 text (``attn2``) and an MLP (``ff``), each merged around itself, after the block's (per-token, for
image-to-video) modulation and before its gate.

Token layout, read at the root: ``hidden_states`` is packed (B, N, C); its grid is the call's ``num_frames``,
``height``, ``width`` (latent sizes) over the patch sizes. The image-to-video and condition pipelines pass a per-token
``timestep``, 0 on the clean first frame: whenever it is per token, that frame is a reference, never reduced (the
condition pipeline's other conditioning frames, at later positions, are not told apart: they are reduced as
generated frames). Text: cross-attention only. Rotary: ``image_rotary_emb = (cos, sin)``, each (B, N, D), gathered
per sample at the kept rows. Keys and values (todo/auto) are reduced at the attention call, after the rotary
embedding.
"""

from __future__ import annotations

import torch

from . import Family
from .base import ComfyBlocks, ComfyModel, Container, DenoiserLayout, Follow, PackedVideoGrid, self_cross_block

ROTARY = Follow("image_rotary_emb", dim=-2, stream="image")


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [
        self_cross_block(b, names=("attn1", "attn2", "ff"), follows=(ROTARY,))
        for b in getattr(module, "transformer_blocks", [])
        if isinstance(getattr(b, "attn1", None), torch.nn.Module)
    ]
    if not blocks:
        return None
    return DenoiserLayout(module, [Container(module, blocks, 1, PackedVideoGrid(module))], "ltx", single_level=True)


FAMILY = Family(
    px=(32, 8),  # LTX's VAE: 32 px, 8 frames per latent cell, 1x1 patches
    name="ltx",
    title="LTX-Video",
    classes=("LTXVideoTransformer3DModel",),
    layout=layout,
    pipelines=("LTXPipeline", "LTXImageToVideoPipeline", "LTXConditionPipeline"),
    cross_attention=True,
    # 161 frames (8x temporal VAE: 21 latent frames) at 512x704 px (32x VAE: 16x22 tokens a frame).
    notes="grid: packed hidden_states (B, N, C) with the call's num_frames, height, width (latent) / patch sizes; a "
    "per-token timestep (image-to-video) makes the first latent frame a reference; text: cross-attention only; rotary: "
    "image_rotary_emb (cos, sin), each (B, N, D), gathered per sample at the kept rows",
    comfy=ComfyModel(
        ("LTXVModel",),
        "LTX-Video",
        patch=(1, 1, 1),
        image="first",
        notes="comfy/ldm/lightricks: self-attention q, k, v (B, S, H*D) after the rotary embedding over the video tokens "
        "(guide keyframe latents appended to the frames are part of the grid); cross-attention to text left alone",
        # its block patches: the video tokens alone, rotary rows along axis 1 of each table of the pe tuple
        blocks=ComfyBlocks((("double_block", "transformer_blocks"),), pe_dims=(1,)),
        # LTX-2 (LTXAVModel, a subclass: video and audio in one packed latent) has its own layout (families/ltx2.py)
        excludes=("LTXAVModel",),
    ),
)
