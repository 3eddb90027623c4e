"""CogVideoX (2B, 5B, 1.5; text-to-video, image-to-video): joint-attention video DiT blocks.

``CogVideoXBlock``: one joint attention (``attn1``) takes the video tokens and the text separately; its processor
concatenates [text; video], applies the 3-D rotary table to the video rows of the queries and keys and calls torch's
SDPA, and returns ``(video, text)``. The MLP (``ff``) then runs on the concatenated [text; video] sequence. Merged:
the video stream around ``attn1``, and the video segment of the joint sequence around ``ff``.

Token layout, read at the root:

- grid: ``hidden_states`` (B, F, C, H, W) — frames before channels — over ``patch_size`` and, for 1.5,
  ``patch_size_t``: a (frames, h, w) grid, frame-major. Image-to-video conditions by channels (every token is
  generated).
- text: ``encoder_hidden_states`` (226 T5 tokens), first in the joint sequence, never reduced.
- rotary: ``image_rotary_emb = (cos, sin)``, each (N_video, D), computed by the pipeline: video rows only, no batch
  dimension; gathered at each sample's kept rows. CogVideoX-2B has no rotary table (sin-cos positions
  added at the patch embedding, before any merge).

Keys and values (todo/auto) are reduced at SDPA, after the rotary embedding.
"""

from __future__ import annotations

from typing import Any

import torch

from ..algorithms import TokenGrid, TokenLayout
from . import Example, Family
from .base import Argument, BlockLayout, Container, DenoiserLayout, Follow, KeyValueSite, Span, text_length

ROTARY = Follow("image_rotary_emb", dim=0, stream="image")


class CogVideoGrid:
    """[text; video] from ``hidden_states`` (B, F, C, H, W) and ``encoder_hidden_states``."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.tokens, self.text = Argument(root, "hidden_states"), Argument(root, "encoder_hidden_states")
        self.p, self.pt = root.config.patch_size, root.config.patch_size_t or 1

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        x = self.tokens(args, kwargs)
        if not isinstance(x, torch.Tensor) or x.ndim != 5:
            return None
        grid = TokenGrid((x.shape[1] // self.pt, x.shape[3] // self.p, x.shape[4] // self.p), patch=(self.pt, self.p, self.p))
        return TokenLayout.joint(("text", "image"), grid, text_length(self.text(args, kwargs)))


def block(module: torch.nn.Module) -> BlockLayout:
    attn, ff = module.attn1, module.ff
    spans = [
        Span("merge_attn", attn, attn, leave_index=0, follows=((attn, ROTARY),), name="attn1"),
        Span("merge_mlp", ff, ff, stream="joint", name="ff"),
    ]
    return BlockLayout(module, spans, [KeyValueSite(attn, stream="joint")], kind=type(module).__name__)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [block(b) for b in getattr(module, "transformer_blocks", []) if isinstance(getattr(b, "attn1", None), torch.nn.Module)]
    if not blocks:
        return None
    return DenoiserLayout(module, [Container(module, blocks, 1, CogVideoGrid(module))], "cogvideox", single_level=True)


def inputs(
    model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int, frames: int | None = None
) -> dict[str, Any]:
    """The CogVideoX pipelines' call at a (frames, height, width) latent (default: 3 frames of tokens): T5 text, the
    pipeline's 3-D rotary table (where the model uses one), classifier-free guidance as one batch."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed
    from diffusers.pipelines.cogvideo.pipeline_cogvideox import get_resize_crop_region_for_grid

    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    frames = 3 * (config.patch_size_t or 1) if frames is None else frames
    found: dict[str, Any] = {
        "hidden_states": torch.randn(batch, frames, config.in_channels, height, width, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.text_embed_dim, generator=g).to(dtype),
        "timestep": torch.full((batch,), 500, dtype=torch.long),
        "return_dict": False,
    }
    if config.ofs_embed_dim:
        found["ofs"] = torch.full((batch,), 2.0)
    if config.use_rotary_positional_embeddings:
        p, pt = config.patch_size, config.patch_size_t
        gh, gw = height // p, width // p
        base = (config.sample_height // p, config.sample_width // p)
        if pt is None:
            crops = get_resize_crop_region_for_grid((gh, gw), base[1], base[0])
            table = get_3d_rotary_pos_embed(config.attention_head_dim, crops, (gh, gw), frames)
        else:
            table = get_3d_rotary_pos_embed(config.attention_head_dim, None, (gh, gw), frames // pt, grid_type="slice", max_size=base)
        found["image_rotary_emb"] = tuple(t.to(dtype) for t in table)
    return found


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    return {**config, "num_layers": min(n, config["num_layers"])}


# transformer/config.json of THUDM/CogVideoX-5b (2B: 30 heads, 30 layers, no rotary table).
CONFIG = {
    "num_attention_heads": 48,
    "attention_head_dim": 64,
    "in_channels": 16,
    "out_channels": 16,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "time_embed_dim": 512,
    "text_embed_dim": 4096,
    "num_layers": 42,
    "dropout": 0.0,
    "attention_bias": True,
    "sample_width": 90,
    "sample_height": 60,
    "sample_frames": 49,
    "patch_size": 2,
    "temporal_compression_ratio": 4,
    "max_text_seq_length": 226,
    "activation_fn": "gelu-approximate",
    "timestep_activation_fn": "silu",
    "norm_elementwise_affine": True,
    "norm_eps": 1e-5,
    "spatial_interpolation_scale": 1.875,
    "temporal_interpolation_scale": 1.0,
    "use_rotary_positional_embeddings": True,
    "use_learned_positional_embeddings": False,
}
# THUDM/CogVideoX1.5-5B: frames patched by 2, no patch bias, 768x1360 px default.
CONFIG_15 = {**CONFIG, "patch_size_t": 2, "patch_bias": False, "sample_height": 96, "sample_width": 170, "sample_frames": 81}
SMALL = {
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "time_embed_dim": 8,
    "text_embed_dim": 16,
    "num_layers": 2,
    "sample_width": 16,
    "sample_height": 18,
    "sample_frames": 9,
}
TEXT_TOKENS = 226
# 49 frames (4x temporal VAE: 13 latent frames) at 480x720 px: CogVideoX-5b's default (1.5: 81 frames, 21).
FAMILY = Family(
    px=(16, 4),
    name="cogvideox",
    title="CogVideoX",
    classes=("CogVideoXTransformer3DModel",),
    layout=layout,
    pipelines=("CogVideoXPipeline", "CogVideoXImageToVideoPipeline", "CogVideoXVideoToVideoPipeline", "CogVideoXFunControlPipeline"),
    examples={
        "cogvideox": Example("CogVideoXTransformer3DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks, frames=13),
        "cogvideox15": Example("CogVideoXTransformer3DModel", CONFIG_15, SMALL, inputs, TEXT_TOKENS, first_blocks, frames=21),
    },
    notes="grid: hidden_states (B, F, C, H, W) / (patch_size_t, patch_size, patch_size), frame-major; text: "
    "encoder_hidden_states, first in the joint sequence; rotary: image_rotary_emb (cos, sin), video rows only, "
    "gathered at each sample's kept rows",
)
