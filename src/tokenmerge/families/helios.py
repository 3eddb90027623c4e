"""Helios (autoregressive long video: a chunk of latent frames at a time, conditioned on compressed history).

``HeliosTransformerBlock``: Wan's self+cross block on the sequence [long; mid; short history; current chunk]. Its
self-attention (``attn1``, the rotary table applied inside) and MLP (``ffn``) run on the whole sequence; with
``guidance_cross_attn`` (the published models) the block splits the history off and its cross-attention (``attn2``)
sees the current chunk alone. Each sub-layer is merged around itself, the current chunk's tokens only, after the
block's modulation (per token: the history's is that of timestep 0) and before its gate. The blocks run span by span
(the modulation has a row per token and the block splits its input by ``original_context_length``).

Token layout, read at the root without a host sync:

- grid: ``hidden_states`` (B, C, F, H, W) over ``patch_size`` (1, 2, 2), frame-major: the current chunk, last in the
  sequence, the one segment reduced.
- references: the history latents, each present where the call passes it with its frame indices, first in the
  sequence: ``latents_history_long`` patched 4x coarser (its sizes padded up: (F/4, H/8, W/8)), then
  ``latents_history_mid`` 2x coarser ((F/2, H/4, W/4)), then ``latents_history_short`` at the chunk's patch (the
  image of image-to-video among its frames). Never reduced.
- text: cross-attention only (``attn2``), never reduced.
- rotary: ``rotary_emb`` (B or 1, N, 2 x D), cos and sin together along its last axis, rows [history; chunk]:
  gathered at each sample's kept rows.

Keys and values (todo/auto) are reduced at ``dispatch_attention_fn`` in ``attn1``, after the rotary embedding: the
history keys stay whole. A model with ``is_amplify_history`` scales the history keys by a count that
``attn1`` takes from the length of its input, which a merge would change: its calls run unchanged.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ..algorithms import TokenGrid, TokenLayout
from ..notices import warn_at_caller
from . import Family
from .base import DECLINED, Argument, BlockLayout, Container, Declined, DenoiserLayout, Follow, self_cross_block
from .wan import pixels

ROTARY = Follow("rotary_emb", dim=1, stream="image")
HISTORY = (("long", 4), ("mid", 2), ("short", 1))  # in sequence order, with each one's patch multiple


class HistoryLayout:
    """[history; chunk] of a Helios call: each history latent given with its indices is a reference grid of its
    patch (a multiple of the chunk's, sizes padded up); the chunk, last, is the target."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.patch = tuple(root.config.patch_size)
        self.tokens = Argument(root, "hidden_states")
        self.history = [
            (Argument(root, f"latents_history_{name}"), Argument(root, f"indices_latents_history_{name}"), k) for name, k in HISTORY
        ]
        self.amplified = bool(root.config.is_amplify_history)
        self.warned = False

    def _grid(self, x: torch.Tensor, multiple: int) -> TokenGrid:
        patch = tuple(p * multiple for p in self.patch)
        return TokenGrid(tuple(math.ceil(s / p) for s, p in zip(x.shape[2:], patch)), patch=patch)

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | Declined | None:
        if self.amplified:
            if not self.warned:
                self.warned = True
                warn_at_caller(
                    "tokenmerge: Helios with is_amplify_history counts its history from attn1's input length; its calls run unchanged"
                )
            return DECLINED
        x = self.tokens(args, kwargs)
        if not isinstance(x, torch.Tensor) or x.ndim != 5:
            return None
        history = []
        for latents, indices, multiple in self.history:
            found = latents(args, kwargs)
            if isinstance(found, torch.Tensor) and found.ndim == 5 and indices(args, kwargs) is not None:
                history.append(self._grid(found, multiple))
        return TokenLayout.joint(("reference", "image"), self._grid(x, 1), 0, tuple(history))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "warned": False}


def _block(block: torch.nn.Module) -> BlockLayout:
    found = self_cross_block(block, follows=(ROTARY,))
    if not block.guidance_cross_attn:
        return found
    # the block hands attn2 the current chunk alone
    return dataclasses.replace(found, spans=[dataclasses.replace(s, stream="target") if s.name == "attn2" else s for s in found.spans])


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [_block(b) for b in getattr(module, "blocks", None) or []]
    if not blocks:
        return None
    return DenoiserLayout(module, [Container(module, blocks, 1, HistoryLayout(module))], "helios", single_level=True)


FAMILY = Family(
    name="helios",
    title="Helios",
    px=pixels,
    classes=("HeliosTransformer3DModel",),
    layout=layout,
    pipelines=("HeliosPipeline", "HeliosPyramidPipeline"),
    cross_attention=True,
    notes="grid: hidden_states (B, C, F, H, W) / patch_size (1, 2, 2), frame-major, last; references: the long, mid "
    "and short history latents (patched 4x, 2x, 1x coarser), first, never reduced; text: cross-attention (attn2) on "
    "the current chunk only; rotary: rotary_emb (B or 1, N, 2D), rows [history; chunk], gathered at each sample's kept rows; "
    "is_amplify_history models run unchanged",
)
