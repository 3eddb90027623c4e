"""HunyuanVideo (text-to-video; image-to-video with token replacement or latent concatenation).

Two block patterns, as in Flux: ``HunyuanVideoTransformerBlock`` (dual-stream: the video stream and the text stream
meet in one joint attention, [video; text], the video merged around ``attn`` and ``ff``) and
``HunyuanVideoSingleTransformerBlock`` (the block appends the text itself; attention and MLP in parallel on the
normalised [video; text] sequence, merged from ``norm``'s output to ``proj_out``'s). The I2V model's
``TokenReplace`` blocks are the same patterns.

Token layout, read at the root:

- grid: ``hidden_states`` (B, C, F, H, W) over (``patch_size_t``, ``patch_size``, ``patch_size``), frame-major. With
  ``image_condition_type="token_replace"`` (HunyuanVideo-I2V) the first latent frame is the clean image, whose
  tokens the blocks modulate apart: a reference segment, never reduced.
- text: ``encoder_hidden_states`` (after the token refiner, same length), after the video.
- rotary: ``image_rotary_emb = (cos, sin)``, each (N_video, D), no batch dimension: gathered at each sample's kept
  rows. The attention mask the model builds over [video; text] (B, 1, 1, N) follows the merge too.

Keys and values (todo/auto) are reduced at the dispatch call, after the rotary embedding, the mask's key columns
with them (nearest interpolations).
"""

from __future__ import annotations

from typing import Any

import torch

from . import Example, Family
from .base import Argument, ComfyModel, Container, DenoiserLayout, Follow, VideoGrid, joint_block, single_stream_block

ROTARY = Follow("image_rotary_emb", dim=0, stream="image")
MASK = Follow("attention_mask", dim=-1, stream="joint")


class TokenReplace:
    """HunyuanVideo-I2V (token replacement): the first latent frame is the condition image, in every call."""

    def __call__(self, args: tuple, kwargs: dict) -> bool:
        return True


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [joint_block(b, follows=(ROTARY, MASK)) for b in getattr(module, "transformer_blocks", [])]
    blocks += [single_stream_block(b, follows=(ROTARY, MASK)) for b in getattr(module, "single_transformer_blocks", [])]
    if not blocks:
        return None
    config = module.config
    replace = TokenReplace() if getattr(config, "image_condition_type", None) == "token_replace" else None
    patch = (config.patch_size_t, config.patch_size, config.patch_size)
    reader = VideoGrid(patch, Argument(module, "hidden_states"), replace, Argument(module, "encoder_hidden_states"))
    return DenoiserLayout(module, [Container(module, blocks, 1, reader)], "hunyuanvideo", single_level=True)


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int, frames: int = 3) -> dict[str, Any]:
    """The HunyuanVideo pipelines' call at a (frames, height, width) latent: Llama text (every token valid) with
    CLIP's pooled prompt, the distilled guidance scale (6.0, x1000), one call per guidance branch."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    return {
        "hidden_states": torch.randn(batch, config.in_channels, frames, height, width, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500, dtype=torch.long),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.text_embed_dim, generator=g).to(dtype),
        "encoder_attention_mask": torch.ones(batch, text_tokens, dtype=torch.long),
        "pooled_projections": torch.randn(batch, config.pooled_projection_dim, generator=g).to(dtype),
        "guidance": torch.full((batch,), 6000.0).to(dtype),
        "return_dict": False,
    }


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_layers": min(n, config["num_layers"]), "num_single_layers": min(n, config["num_single_layers"])}


# transformer/config.json of hunyuanvideo-community/HunyuanVideo (13B).
CONFIG = {
    "in_channels": 16,
    "out_channels": 16,
    "num_attention_heads": 24,
    "attention_head_dim": 128,
    "num_layers": 20,
    "num_single_layers": 40,
    "num_refiner_layers": 2,
    "mlp_ratio": 4.0,
    "patch_size": 2,
    "patch_size_t": 1,
    "qk_norm": "rms_norm",
    "guidance_embeds": True,
    "text_embed_dim": 4096,
    "pooled_projection_dim": 768,
    "rope_theta": 256.0,
    "rope_axes_dim": (16, 56, 56),
}
SMALL = {
    "in_channels": 4,
    "out_channels": 4,
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "num_layers": 1,
    "num_single_layers": 1,
    "num_refiner_layers": 1,
    "text_embed_dim": 16,
    "pooled_projection_dim": 8,
    "rope_axes_dim": (4, 6, 6),
}
# HunyuanVideo-I2V: the image latent concatenated as channels, and its first frame replaced in the tokens.
I2V = {**CONFIG, "in_channels": 33, "image_condition_type": "token_replace"}
SMALL_I2V = {**SMALL, "in_channels": 9, "image_condition_type": "token_replace"}
TEXT_TOKENS = 256  # the pipeline's max_sequence_length (the prompt template's tokens cropped)
FAMILY = Family(
    px=(16, 4),
    name="hunyuanvideo",
    title="HunyuanVideo",
    classes=("HunyuanVideoTransformer3DModel",),
    layout=layout,
    pipelines=("HunyuanVideoPipeline", "HunyuanVideoImageToVideoPipeline"),
    # 129 frames (33 latent) at 720x1280 px: the pipeline's default.
    examples={
        "hunyuanvideo": Example("HunyuanVideoTransformer3DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks, frames=33),
        "hunyuanvideo-i2v": Example("HunyuanVideoTransformer3DModel", I2V, SMALL_I2V, inputs, TEXT_TOKENS, first_blocks, frames=33),
    },
    notes="grid: hidden_states (B, C, F, H, W) / (patch_size_t, patch_size, patch_size), frame-major; token_replace I2V: "
    "the first latent frame is a reference; text: encoder_hidden_states, after the video; rotary: image_rotary_emb "
    "(cos, sin), video rows, gathered at each sample's kept rows; the joint attention mask follows",
    comfy=ComfyModel(
        ("HunyuanVideo",),
        "HunyuanVideo",
        patch=(1, 2, 2),
        image="first",
        declines=("ref_latent",),
        notes="comfy/ldm/hunyuan_video: Flux's blocks flipped, q, k, v (B, H, S, D) after the rotary embedding, [video; "
        "text]; the text refiner's attention (text only) left alone",
    ),
)
