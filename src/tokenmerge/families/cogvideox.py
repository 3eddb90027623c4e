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

import torch

from ..algorithms import TokenGrid, TokenLayout
from . import Family
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


# 49 frames (4x temporal VAE: 13 latent frames) at 480x720 px: CogVideoX-5b's default (1.5: 81 frames, 21).
FAMILY = Family(
    px=(16, 4),
    name="cogvideox",
    title="CogVideoX",
    classes=("CogVideoXTransformer3DModel",),
    layout=layout,
    pipelines=("CogVideoXPipeline", "CogVideoXImageToVideoPipeline", "CogVideoXVideoToVideoPipeline", "CogVideoXFunControlPipeline"),
    notes="grid: hidden_states (B, F, C, H, W) / (patch_size_t, patch_size, patch_size), frame-major; text: "
    "encoder_hidden_states, first in the joint sequence; rotary: image_rotary_emb (cos, sin), video rows only, "
    "gathered at each sample's kept rows",
)
