"""The examples of the ltx2 family (tokenmerge.families.ltx2): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from . import ComfyExample, Example, clean_first_frame


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


FAMILY = "ltx2"
EXAMPLES = {
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
}


# ComfyUI's own implementation (LTXAVModel, comfy/ldm/lightricks/av_model.py) at a tiny width: the conditioning is the
# text encoder's fully processed context, the video's and the audio's prompt side by side (32 + 16 channels).
COMFY = ComfyExample(
    supported="LTXAV",
    unet_config={
        "image_model": "ltxav",
        "num_layers": 1,
        "attention_head_dim": 16,
        "num_attention_heads": 2,
        "cross_attention_dim": 32,
        "audio_attention_head_dim": 8,
        "audio_num_attention_heads": 2,
        "audio_cross_attention_dim": 16,
        "caption_channels": 24,
        "in_channels": 128,
        "audio_in_channels": 128,
        "connector_attention_head_dim": 8,
        "connector_num_attention_heads": 3,
        "audio_connector_attention_head_dim": 8,
        "audio_connector_num_attention_heads": 3,
        "connector_num_layers": 1,
    },
    context=48,
    pooled=0,
    channels=128,
    video=True,
    caption_mask=True,
    since="0.33.0",
    audio=(8, 8, 16),
    downscale=32,
)
