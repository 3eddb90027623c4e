"""Kandinsky 5.0 (T2V, I2V, T2I, I2I; Lite and Pro): text encoder blocks, then visual decoder blocks of self+cross.

``Kandinsky5TransformerEncoderBlock`` (``text_transformer_blocks``) refines the Qwen2.5-VL text on its own: not
patched, the text is never reduced. ``Kandinsky5TransformerDecoderBlock`` (``visual_transformer_blocks``):
self-attention (``self_attention``, with the 3-D rotary table passed as ``rotary_emb``), cross-attention
(``cross_attention``) to the refined text and an MLP (``feed_forward``), on the visual tokens alone, each merged
around itself after the block's per-sample modulation and before its gate, as Wan's blocks are.

Token layout, read at the root:

- grid: ``hidden_states`` (B, F, H, W, C), channels last, over ``patch_size`` (1, 2, 2): a (frames, h, w) grid,
  frame-major (``fractal_flatten`` without a block mask is a plain flatten). Images are one-frame videos.
- condition frame: models with ``visual_cond`` take 2C + 1 channels, the condition latent and a mask last; image-to-
  video sets the mask on the first latent frame, which holds the clean image (and which the pipeline never steps):
  then that frame is a reference segment, never reduced, read by one host read of the mask per latent tensor.
  Image-to-image conditions by channels on its single frame: every token is generated.
- text: cross-attention only, never reduced.
- rotary: ``rotary_emb`` (B, N, 1, D/2, 2, 2), rows along dim 1: gathered at each sample's kept rows.

Keys and values (todo/auto) are reduced at ``dispatch_attention_fn`` in ``self_attention``, after the rotary
embedding. Calls with NABLA sparse attention (``sparse_params``: ``attention_type="nabla"``, the 10 s models) run
unchanged: their block mask covers 64-token blocks of 8x8 tiles in a reordered ("fractal") sequence, which a merged or
reduced sequence no longer fills.
"""

from __future__ import annotations

import torch

from ..algorithms import TokenLayout
from ..notices import warn_at_caller
from . import Family
from .base import (
    DECLINED,
    Argument,
    Container,
    Declined,
    DenoiserLayout,
    Follow,
    HostReads,
    self_cross_block,
    video_layout,
)

ROTARY = Follow("rotary_emb", dim=1, stream="image")
NAMES = ("self_attention", "cross_attention", "feed_forward")


def _first_frame_conditioned(x: torch.Tensor) -> bool:
    """Whether the condition mask (the last channel) is set on the first latent frame (the first sample's: the
    pipelines give every sample the same)."""
    return bool(x[0, 0, 0, 0, -1] > 0)


class ChannelsLastVideo:
    """The (frames, h, w) grid of a (B, F, H, W, C) latent; with ``visual_cond``, the first frame a reference where
    the condition mask says so; calls with sparse attention declined."""

    def __init__(self, root: torch.nn.Module) -> None:
        config = root.config
        self.tokens, self.sparse = Argument(root, "hidden_states"), Argument(root, "sparse_params")
        self.patch = tuple(config.patch_size)
        self.masked = 2 * config.in_visual_dim + 1 if config.visual_cond else None  # channels carrying the mask
        self.reads = HostReads()
        self.warned = False

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | Declined | None:
        if self.sparse(args, kwargs) is not None:
            if not self.warned:
                self.warned = True
                warn_at_caller(
                    "tokenmerge: Kandinsky 5 calls with sparse (NABLA) attention run unchanged: its block mask covers "
                    "64-token tiles that a merged or reduced sequence no longer fills"
                )
            return DECLINED
        x = self.tokens(args, kwargs)
        if not isinstance(x, torch.Tensor) or x.ndim != 5:
            return None
        pt, ph, pw = self.patch
        shape = (x.shape[1] // pt, x.shape[2] // ph, x.shape[3] // pw)
        condition = x.shape[-1] == self.masked and self.reads(x, _first_frame_conditioned)
        return video_layout(shape, self.patch, condition)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "warned": False}


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [
        self_cross_block(b, names=NAMES, follows=(ROTARY,), input_name="visual_embed")
        for b in getattr(module, "visual_transformer_blocks", None) or []
    ]
    if not blocks:
        return None
    return DenoiserLayout(module, [Container(module, blocks, 1, ChannelsLastVideo(module))], "kandinsky5", single_level=True)


FAMILY = Family(
    px=(16, 4),  # 2x2 patches of the 8x VAEs (HunyuanVideo's for video: 4 frames per latent frame)
    name="kandinsky5",
    title="Kandinsky 5.0",
    classes=("Kandinsky5Transformer3DModel",),
    layout=layout,
    pipelines=("Kandinsky5T2VPipeline", "Kandinsky5I2VPipeline", "Kandinsky5T2IPipeline", "Kandinsky5I2IPipeline"),
    cross_attention=True,
    notes="grid: hidden_states (B, F, H, W, C) / patch_size (1, 2, 2), channels last, frame-major; I2V: the first latent "
    "frame, marked in the condition mask channel, is a reference (one host read per latent tensor); text: encoder "
    "blocks unpatched, cross-attention only; rotary: rotary_emb (B, N, 1, D/2, 2, 2), gathered at each sample's kept "
    "rows; NABLA sparse-attention calls run unchanged",
)
