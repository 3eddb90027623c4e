"""The examples of the minimax-h3 family (tokenmerge.families.minimaxh3): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example

AUDIO_LATENTS = 4  # audio latents per channel of the tiny example (the soundtrack is stereo, packed channel-major)


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int, frames: int = 3) -> dict[str, Any]:
    """The modular pipeline's call (first-frame keyframe to video and audio) at a (frames, height, width) latent: the
    packed layout its layout step builds ([text | keyframe | audio | target video]), the video rows patchified
    (the keyframe's first), the audio rows, the distinct timesteps (the target's, the keyframe's and the audio's
    noise-augmentation level, 1 = clean) and each row's index into them."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3PrepareLayoutStep

    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    pt, ph, pw = config.patch_size
    position_ids, tags, video, audio, text, condition, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        torch.ones(text_tokens, dtype=torch.long), frames // pt, height, width, AUDIO_LATENTS, (pt, ph, pw), 2, 2, 0, ("first",)
    )
    timestep_indices = torch.zeros(position_ids.shape[0], dtype=torch.long)
    timestep_indices[video[:condition]] = 1
    patch = config.in_channels * pt * ph * pw
    return {
        "hidden_states": torch.randn(batch, video.numel(), patch, generator=g).to(dtype),
        "audio_hidden_states": torch.randn(batch, audio.numel(), config.audio_in_channels, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.text_dim, generator=g).to(dtype),
        "timestep": torch.tensor([0.5, 1.0]),
        "timestep_indices": timestep_indices,
        "token_tags": tags,
        "position_ids": position_ids.float(),
        "video_indices": video,
        "audio_indices": audio,
        "text_indices": text,
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_layers": min(n, config["num_layers"])}


# MiniMaxH3Transformer3DModel's defaults, which its docstring gives as the released model's (the published
# transformer/config.json was not read here: no hub access).
CONFIG = {
    "num_attention_heads": 56,
    "attention_head_dim": 128,
    "hidden_size": 5376,
    "num_layers": 50,
    "num_refiner_layers": 2,
    "ffn_dim": 14336,
    "in_channels": 24,
    "audio_in_channels": 32,
    "patch_size": (1, 2, 2),
    "text_dim": 5120,
    "freq_dim": 256,
    "time_embed_hidden_dim": 5376,
    "time_embed_dim": 2688,
    "rope_freq_dim": 16,
}


SMALL = {
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "hidden_size": 24,
    "num_layers": 2,
    "num_refiner_layers": 1,
    "ffn_dim": 32,
    "in_channels": 4,
    "audio_in_channels": 4,
    "text_dim": 16,
    "freq_dim": 16,
    "time_embed_hidden_dim": 16,
    "time_embed_dim": 16,
    "rope_freq_dim": 2,
}


# Qwen3-VL prompt tokens: unpadded, the prompt's own length.
TEXT_TOKENS = 256


# 124 frames (17 * 7 + 5, the VAE's alignment: 37 latent frames), about 5 s at 24 fps.
FRAMES = 37


FAMILY = "minimax-h3"
EXAMPLES = {
    "minimax-h3": Example(
        "MiniMaxH3Transformer3DModel",
        CONFIG,
        SMALL,
        inputs,
        TEXT_TOKENS,
        first_blocks,
        frames=FRAMES,
        vae_factor=16,
        frame_factor=3,
    ),
}
