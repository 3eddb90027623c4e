"""LTX-2 (audio and video, text/image-to-video): blocks with a video stream and an audio stream side by side.

``LTX2VideoTransformerBlock``: the video tokens run self-attention (``attn1``, the video rotary table as
``query_rotary_emb``, also used for the keys), cross-attention to the text (``attn2``), cross-attention to the audio
(``audio_to_video_attn``) and an MLP (``ff``); the audio tokens run the same sub-layers of their own (``audio_*``)
and attend to the video in ``video_to_audio_attn``. Only the video stream is reduced: merged around ``attn1``,
``attn2``, ``audio_to_video_attn`` (both cross-attentions follow ``merge_crossattn``, off by default) and ``ff``; the
audio stream, and the video seen as keys by the audio, are untouched.

Token layout, read at the root:

- grid: ``hidden_states`` is packed (B, N, C); its (frames, height, width) in tokens are the call's ``num_frames``,
  ``height`` and ``width`` (latent sizes, which the pipelines pass) over ``patch_size_t`` / ``patch_size``. The
  image-to-video pipelines pass a per-token ``timestep`` that is 0 on the first latent frame (the clean image):
  whenever ``timestep`` is per token, that frame is a reference segment, never reduced.
- text: cross-attention only.
- rotary: ``query_rotary_emb = (cos, sin)``, one row per video token along dim -2 with a batch dimension
  ((B, N, D) interleaved, (B, H, N, D/2) split): gathered per sample at the kept rows. ``audio_to_video_attn``'s
  video table (temporal only) follows the same way.

Keys and values (todo/auto) are reduced at ``dispatch_attention_fn`` in ``attn1``, after the rotary embedding. A
video self-attention mask (IC-LoRA's ``video_self_attention_mask``) makes that sub-layer run unmerged (one warning).
"""

from __future__ import annotations

import torch

from . import Family
from .base import BlockLayout, ComfyModel, Container, DenoiserLayout, Follow, KeyValueSite, PackedVideoGrid, Span

ROTARY = Follow("query_rotary_emb", dim=-2, stream="image")


def block(module: torch.nn.Module) -> BlockLayout:
    attn1 = module.attn1
    spans = [Span("merge_attn", attn1, attn1, follows=((attn1, ROTARY),), name="attn1")]
    for name in ("attn2", "audio_to_video_attn"):
        sub = getattr(module, name)
        spans.append(Span("merge_crossattn", sub, sub, follows=((sub, ROTARY),), name=name))
    spans.append(Span("merge_mlp", module.ff, module.ff, name="ff"))
    kv = [KeyValueSite(attn1, stream="image", mask_kwarg="attention_mask")]
    return BlockLayout(module, spans, kv, kind=type(module).__name__)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [block(b) for b in getattr(module, "transformer_blocks", []) if isinstance(getattr(b, "attn1", None), torch.nn.Module)]
    if not blocks:
        return None
    return DenoiserLayout(module, [Container(module, blocks, 1, PackedVideoGrid(module))], "ltx2", single_level=True)


FAMILY = Family(
    px=(32, 8),  # LTX's VAE: 32 px, 8 frames per latent cell, 1x1 patches
    name="ltx2",
    title="LTX-2",
    classes=("LTX2VideoTransformer3DModel",),
    layout=layout,
    pipelines=("LTX2Pipeline", "LTX2ImageToVideoPipeline", "LTX2ConditionPipeline"),
    cross_attention=True,
    # 121 frames (8x temporal VAE: 16 latent frames) at 512x768 px (32x VAE: 16x24 tokens a frame).
    notes="grid: packed hidden_states (B, N, C) with the call's num_frames, height, width (latent) / patch sizes; a "
    "per-token timestep (image-to-video) makes the first latent frame a reference; text: cross-attention only; audio "
    "stream untouched; rotary: query_rotary_emb (cos, sin), video rows along dim -2, per sample, gathered at the kept rows",
    comfy=ComfyModel(
        ("LTXAVModel",),
        "LTX-2",
        patch=(1, 1, 1),
        image="alone",
        notes="comfy/ldm/lightricks/av_model.py: the sampler packs the video and audio latents into one (latent_shapes), "
        "the grid is the video's; video self-attention q, k, v (B, S, H*D) after the rotary embedding, as long as the grid "
        "(guide keyframes appended to the frames are part of it); the audio's self-attention, both cross-modal attentions "
        "and the text cross-attention left alone",
    ),
)
