"""Motif-Video (text-to-video and image-to-video): dual-stream, then single-stream video DiT blocks, as HunyuanVideo.

``MotifVideoTransformerBlock`` (dual-stream): the video stream and the context stream meet in one joint attention
(``attn``, [video; context]), the video merged around ``attn`` (its output element 0) and ``ff``; the optional text
cross-attention (``cross_attn``) takes the attention's video output, unmerged by then.
``MotifVideoSingleTransformerBlock`` appends the context itself and runs attention and MLP in parallel on the
normalised [video; context] sequence, merged from ``norm``'s output to ``proj_out``'s (its optional ``cross_attn``
inside the span). With ``num_decoder_layers > 0`` the last single blocks take the encoder's video output as their
context instead of the text, another sequence ([video; video]) than the other blocks' in the same call: those decoder
blocks are not patched (they run whole, their keys and values too).

Token layout, read at the root:

- grid: ``hidden_states`` (B, C, F, H, W) over (``patch_size_t``, ``patch_size``, ``patch_size``), frame-major.
  Image-to-video conditions by channels (the image latent and a mask): every video token is generated.
- context (never reduced): the text (``encoder_hidden_states``) and, for image-to-video, the vision tokens
  (``image_embeds``), which the model puts before the text: after the video, its length the sum of theirs.
- rotary: ``image_rotary_emb = (cos, sin)``, each (N_video, D), no batch dimension: gathered at each sample's kept
  rows. The attention mask the model builds over [video; context] (B, 1, 1, N) follows the merge too (the
  cross-attention reads its last columns, the context's).

Keys and values (todo/auto) are reduced at the joint attention's dispatch call, after the rotary embedding, the mask's
key columns with them; the cross-attention's keys are the text's, never reduced.
"""

from __future__ import annotations

import dataclasses

import torch

from . import Family
from .base import BlockLayout, Container, DenoiserLayout, Follow, joint_block, single_stream_block
from .hunyuanvideo15 import VideoAndContext

ROTARY = Follow("image_rotary_emb", dim=0, stream="image")
MASK = Follow("attention_mask", dim=-1, stream="joint")


def _single(block: torch.nn.Module) -> BlockLayout:
    found = single_stream_block(block, follows=(ROTARY, MASK))
    cross = block.cross_attn
    if cross is None:
        return found
    (span,) = found.spans
    follows = (*span.follows, (cross, ROTARY), (cross, MASK))
    return dataclasses.replace(found, spans=[dataclasses.replace(span, follows=follows)])


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [joint_block(b, follows=(ROTARY, MASK)) for b in getattr(module, "transformer_blocks", None) or []]
    singles = list(getattr(module, "single_transformer_blocks", None) or [])
    blocks += [_single(b) for b in singles[: len(singles) - module.config.num_decoder_layers]]
    if not blocks:
        return None
    return DenoiserLayout(
        module,
        [Container(module, blocks, 1, VideoAndContext(module, ("encoder_hidden_states", "image_embeds")))],
        "motif-video",
        single_level=True,
    )


FAMILY = Family(
    px=(16, 4),  # 2x2 patches of the 8x VAE's latent cells, 4 frames per latent frame
    name="motif-video",
    title="Motif-Video",
    classes=("MotifVideoTransformer3DModel",),
    layout=layout,
    pipelines=("MotifVideoPipeline", "MotifVideoImage2VideoPipeline"),
    notes="grid: hidden_states (B, C, F, H, W) / (patch_size_t, patch_size, patch_size), frame-major; context (vision "
    "tokens, then text; never reduced): after the video, its length the sum of image_embeds and encoder_hidden_states; "
    "rotary: image_rotary_emb (cos, sin), video rows only, gathered at each sample's kept rows; the joint attention mask "
    "follows; decoder single blocks (num_decoder_layers) unpatched",
)
