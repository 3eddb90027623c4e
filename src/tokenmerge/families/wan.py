"""Wan 2.1 / 2.2 (T2V, I2V, FLF2V, TI2V, the 2.2 A14B pair of experts) and VACE: video DiTs of self+cross blocks.

``WanTransformerBlock``: self-attention (``attn1``, with Wan's 3-D rotary ``(cos, sin)`` passed positionally),
cross-attention (``attn2``) to the umT5 text — and, in I2V/FLF2V, to the CLIP image tokens prepended to it, which
the processor splits off by the text's fixed 512 — and an MLP (``ffn``), on the video tokens alone. Each sub-layer
is merged around itself, after the block's modulation (Wan 2.2 TI2V's per-token modulation stays per token) and
before its gate. VACE adds ``vace_blocks`` of the same structure over the control tokens (``control_hidden_states``,
padded to the video's length): matched on those.

Token layout, read at the root without a host sync:

- grid: ``hidden_states`` (B, C, F, H, W) over ``patch_size`` (1, 2, 2): a (frames, h, w) grid, frame-major. Wan 2.1
  I2V and 2.2 A14B I2V condition by channels (the image latent and a mask concatenated to C): every token is
  generated. Wan 2.2 TI2V passes a per-token ``timestep`` (B, N) and, for image-to-video, the first latent frame
  is the clean image: whenever ``timestep`` is per token, the first frame is a reference segment, never reduced
  (also in TI2V's text-to-video mode, where it could be: a host read would be needed to tell them apart).
- text: cross-attention only (``attn2``); the CLIP image tokens sit in the same context: neither is reduced.
- rotary: ``rotary_emb = (cos, sin)``, each (1, N, 1, D): no batch dimension, rows along dim 1; both gathered at
  each sample's kept rows (a merged token takes its destination's position).

Keys and values (todo/auto) are reduced at ``dispatch_attention_fn`` in ``attn1``, after the rotary embedding: a
kept key keeps its exact 3-D position. The pipelines run the two halves of classifier-free guidance as two calls.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from . import Example, Family
from .base import (
    Argument,
    ComfyModel,
    Container,
    DenoiserLayout,
    Follow,
    PerTokenTimestep,
    VideoGrid,
    clean_first_frame,
    config_int,
    self_cross_block,
)

ROTARY = Follow("rotary_emb", dim=1, stream="image")


def _blocks(module: torch.nn.Module, name: str, input_name: str) -> list:
    return [
        self_cross_block(b, follows=(ROTARY,), input_name=input_name)
        for b in getattr(module, name, None) or []
        if isinstance(getattr(b, "attn1", None), torch.nn.Module)
    ]


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = _blocks(module, "vace_blocks", "control_hidden_states") + _blocks(module, "blocks", "hidden_states")
    if not blocks:
        return None
    patch = tuple(module.config.patch_size)
    reader = VideoGrid(patch, Argument(module, "hidden_states"), PerTokenTimestep(module))
    return DenoiserLayout(module, [Container(module, blocks, 1, reader)], "wan", single_level=True)


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
    """The Wan pipelines' call at a (frames, height, width) latent: umT5 text padded to its length; I2V models get
    the CLIP image tokens (257) and 20 extra channels (mask and image latent); TI2V a per-token timestep whose first
    frame is 0 (``condition_frame``: image-to-video); VACE its control latent (96 channels)."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    if config.image_dim is not None:
        text_tokens = TEXT_TOKENS  # the I2V processor takes whatever precedes the last 512 context tokens as CLIP's
    found: dict[str, Any] = {
        "hidden_states": torch.randn(batch, config.in_channels, frames, height, width, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500.0),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.text_dim, generator=g).to(dtype),
        "return_dict": False,
    }
    if config.image_dim is not None:
        found["encoder_hidden_states_image"] = torch.randn(batch, 257, config.image_dim, generator=g).to(dtype)
    if "vace_in_channels" in config:
        found["control_hidden_states"] = torch.randn(batch, config.vace_in_channels, frames, height, width, generator=g).to(dtype)
    if condition_frame:
        pt, ph, pw = config.patch_size
        per_frame = (height // ph) * (width // pw)
        found["timestep"] = clean_first_frame(batch, (frames // pt) * per_frame, per_frame, 500.0)
    return found


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    found = {**config, "num_layers": min(n, config["num_layers"])}
    if "vace_layers" in config:
        found["vace_layers"] = [i for i in config["vace_layers"] if i < found["num_layers"]]
    return found


# transformer/config.json of Wan-AI/Wan2.1-T2V-1.3B-Diffusers (14B: 40 heads, ffn 13824, 40 layers; Wan 2.2 A14B:
# two such experts, transformer and transformer_2).
CONFIG = {
    "patch_size": (1, 2, 2),
    "num_attention_heads": 12,
    "attention_head_dim": 128,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": 4096,
    "freq_dim": 256,
    "ffn_dim": 8960,
    "num_layers": 30,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6,
    "image_dim": None,
    "added_kv_proj_dim": None,
    "rope_max_seq_len": 1024,
}
# Wan-AI/Wan2.1-I2V-14B-480P-Diffusers: the image latent and mask as 20 more channels, CLIP ViT-H image tokens.
I2V = {
    **CONFIG,
    "num_attention_heads": 40,
    "ffn_dim": 13824,
    "num_layers": 40,
    "in_channels": 36,
    "image_dim": 1280,
    "added_kv_proj_dim": 5120,
}
# Wan-AI/Wan2.2-TI2V-5B-Diffusers (its VAE compresses 16x spatially: 48 latent channels).
TI2V = {**CONFIG, "num_attention_heads": 24, "ffn_dim": 14336, "in_channels": 48, "out_channels": 48}
# Wan-AI/Wan2.1-VACE-1.3B-diffusers.
VACE = {**CONFIG, "vace_layers": list(range(0, 30, 2)), "vace_in_channels": 96}
SMALL = {"num_attention_heads": 2, "attention_head_dim": 12, "text_dim": 16, "ffn_dim": 32, "num_layers": 2, "rope_max_seq_len": 32}
SMALL_I2V = {**SMALL, "in_channels": 8, "out_channels": 4, "image_dim": 16, "added_kv_proj_dim": 24}
SMALL_TI2V = {**SMALL, "in_channels": 48, "out_channels": 48}
SMALL_VACE = {**SMALL, "vace_layers": [0], "vace_in_channels": 8}
# umT5's prompt is padded to 512 tokens (and the I2V processor counts the CLIP tokens as what precedes them).
TEXT_TOKENS = 512
# 81 frames (4x temporal VAE: 21 latent frames) at 480x832 px: the pipelines' default.
FRAMES = 21


def pixels(root: torch.nn.Module) -> tuple[int, int]:
    """(px per token side, video frames per latent frame): 2x2 patches of the Wan VAE's 8 px cells, or of Wan 2.2's
    16 px ones where the model takes its 48-channel latents (TI2V 5B); 4 frames per latent frame either way."""
    return (32 if config_int(root, "in_channels", 16) == 48 else 16), 4


FAMILY = Family(
    name="wan",
    title="Wan 2.1 / 2.2",
    px=pixels,
    classes=("WanTransformer3DModel", "WanVACETransformer3DModel"),
    layout=layout,
    pipelines=("WanPipeline", "WanImageToVideoPipeline", "WanVideoToVideoPipeline", "WanVACEPipeline"),
    cross_attention=True,
    examples={
        "wan": Example("WanTransformer3DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks, frames=FRAMES),
        "wan-i2v": Example("WanTransformer3DModel", I2V, SMALL_I2V, inputs, TEXT_TOKENS, first_blocks, frames=FRAMES),
        "wan-ti2v": Example(
            "WanTransformer3DModel", TI2V, SMALL_TI2V, partial(inputs, condition_frame=True), TEXT_TOKENS, first_blocks, frames=FRAMES
        ),
        "wan-vace": Example("WanVACETransformer3DModel", VACE, SMALL_VACE, inputs, TEXT_TOKENS, first_blocks, frames=FRAMES),
    },
    notes="grid: hidden_states (B, C, F, H, W) / patch_size (1, 2, 2), frame-major; a per-token timestep (Wan 2.2 "
    "TI2V) makes the first latent frame a reference; text and CLIP image tokens: cross-attention (attn2) only; rotary: "
    "rotary_emb (cos, sin), each (1, N, 1, D), gathered at each sample's kept rows; VACE blocks matched on "
    "control_hidden_states",
    comfy=ComfyModel(
        ("WanModel",),
        "Wan 2.1 / 2.2",
        patch=(1, 2, 2),
        image="last",
        notes="comfy/ldm/wan: self-attention q, k, v (B, S, H*D) after the rotary embedding over the video tokens "
        "(a reference latent, if any, first); cross-attention to text and I2V's CLIP image tokens left alone",
    ),
)
