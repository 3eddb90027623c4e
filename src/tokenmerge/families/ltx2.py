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

from functools import partial
from typing import Any

import torch

from . import Example, Family
from .base import BlockLayout, Container, DenoiserLayout, Follow, KeyValueSite, PackedVideoGrid, Span, clean_first_frame

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


def inputs(
    model: torch.nn.Module,
    height: int,
    width: int,
    batch: int,
    seed: int,
    text_tokens: int,
    frames: int = 3,
    condition_frame: bool = False,
) -> dict[str, Any]:
    """The LTX-2 pipelines' call at a (frames, height, width) latent: packed video tokens, the audio latent of the
    same duration (25 audio frames a second of 24 fps video, 8 video frames a latent frame), the prompt through
    the connectors (same tokens for both streams), guidance as one batch; ``condition_frame``: image-to-video's
    per-token timestep, 0 on the first latent frame."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    audio = max(4, round((frames - 1) * 8 / 24 * 25) + 1)
    n = frames * height * width
    timestep: torch.Tensor = torch.full((batch,), 0.5)
    if condition_frame:
        timestep = clean_first_frame(batch, n, height * width, 0.5)
    return {
        "hidden_states": torch.randn(batch, n, config.in_channels, generator=g).to(dtype),
        "audio_hidden_states": torch.randn(batch, audio, config.audio_in_channels, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.caption_channels, generator=g).to(dtype),
        "audio_encoder_hidden_states": torch.randn(batch, text_tokens, config.caption_channels, generator=g).to(dtype),
        "timestep": timestep,
        "audio_timestep": torch.full((batch,), 0.5),
        "sigma": torch.full((batch,), 0.5),
        "num_frames": frames,
        "height": height,
        "width": width,
        "audio_num_frames": audio,
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_layers": min(n, config["num_layers"])}


def video_output(output: Any) -> torch.Tensor:
    return output[0]


# The class's defaults: Lightricks/LTX-2's transformer (19B with its audio stream; 32x spatial, 8x temporal VAE).
CONFIG: dict[str, Any] = {"num_layers": 48}
SMALL = {
    "in_channels": 8,
    "out_channels": 8,
    "num_attention_heads": 2,
    "attention_head_dim": 8,
    "cross_attention_dim": 16,
    "audio_in_channels": 4,
    "audio_out_channels": 4,
    "audio_num_attention_heads": 2,
    "audio_attention_head_dim": 4,
    "audio_cross_attention_dim": 8,
    "num_layers": 2,
    "caption_channels": 16,
}
# Gemma 3 prompt through the connectors (padded to 1024 tokens by the pipeline).
TEXT_TOKENS = 1024
FAMILY = Family(
    px=(32, 8),  # LTX's VAE: 32 px, 8 frames per latent cell, 1x1 patches
    name="ltx2",
    title="LTX-2",
    classes=("LTX2VideoTransformer3DModel",),
    layout=layout,
    pipelines=("LTX2Pipeline", "LTX2ImageToVideoPipeline", "LTX2ConditionPipeline"),
    cross_attention=True,
    # 121 frames (8x temporal VAE: 16 latent frames) at 512x768 px (32x VAE: 16x24 tokens a frame).
    examples={
        "ltx2": Example(
            "LTX2VideoTransformer3DModel",
            CONFIG,
            SMALL,
            inputs,
            TEXT_TOKENS,
            first_blocks,
            video_output,
            1,
            frames=16,
            vae_factor=32,
            frame_factor=8,
        ),
        "ltx2-i2v": Example(
            "LTX2VideoTransformer3DModel",
            CONFIG,
            SMALL,
            partial(inputs, condition_frame=True),
            TEXT_TOKENS,
            first_blocks,
            video_output,
            1,
            frames=16,
            vae_factor=32,
            frame_factor=8,
        ),
    },
    notes="grid: packed hidden_states (B, N, C) with the call's num_frames, height, width (latent) / patch sizes; a "
    "per-token timestep (image-to-video) makes the first latent frame a reference; text: cross-attention only; audio "
    "stream untouched; rotary: query_rotary_emb (cos, sin), video rows along dim -2, per sample, gathered at the kept rows",
)
