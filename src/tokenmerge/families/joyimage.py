"""JoyImage Edit and JoyImage Edit Plus: dual-stream DiTs of Wan-style modulated blocks over [image; text].

``JoyImageEditPlusTransformerBlock`` (Edit Plus): image and text streams with their own weights meet in one joint
attention whose processor concatenates [image; text] and returns ``(image, text)``; the image stream is merged around
``attn`` (element 0 of its output) and around ``img_mlp``, after the block's modulation and before its gates.

Token layout of Edit Plus, read at the root without a host sync:

- grid and references: ``shape_list``, a python list with one entry per sample, each a list of ``(t, h, w)`` in patch
  tokens: the target first, then each reference image, laid end to end in the patchified ``hidden_states``
  (B, N, C, pt, ph, pw). References are segments of their own, never reduced. Samples whose lists differ (each padded
  to the longest with rows the mask hides) run unchanged, one warning.
- text: ``encoder_hidden_states.shape[1]``, after the image in the joint attention.
- rotary: ``image_rotary_emb = (cos, sin)``, each (B, N, D), one row per image-stream token: gathered at each sample's
  kept rows. Mask: ``attention_mask`` (B, 1, 1, N + T) where the pipeline passes the text's, its columns following.

Keys and values (todo/auto) are reduced at ``dispatch_attention_fn``, after the rotary embedding.

JoyImage Edit (``JoyImageEditTransformer3DModel``) is refused: its attention gets the rotary tables nested as
``((image cos, image sin), (text cos, text sin))``, without a batch dimension, and reshapes them with ``view``, which
neither a merge's per-sample gather nor its batch-shared rows can reach.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..algorithms import TokenGrid, TokenLayout
from ..notices import warn_at_caller
from . import Family
from .base import DECLINED, Argument, Container, Declined, DenoiserLayout, Follow, joint_block, text_length

FOLLOWS = (Follow("image_rotary_emb", dim=1, stream="image"), Follow("attention_mask", dim=-1, stream="joint"))


class ShapeList:
    """[target; references; text] of an Edit Plus call from its ``shape_list`` (python lists: no host sync)."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.shapes, self.tokens = Argument(root, "shape_list"), Argument(root, "hidden_states")
        self.text = Argument(root, "encoder_hidden_states")
        self.patch = tuple(root.config.patch_size)
        self.warned = False

    def _grid(self, shape: tuple[int, ...]) -> TokenGrid:
        t, h, w = shape
        pt, ph, pw = self.patch
        return TokenGrid((h, w), patch=(ph, pw)) if t == 1 else TokenGrid((t, h, w), patch=(pt, ph, pw))

    def _samples(self, shapes: Any) -> list[tuple[tuple[int, ...], ...]] | None:
        try:
            samples = [tuple(tuple(int(v) for v in shape) for shape in entry) for entry in shapes]
        except (TypeError, ValueError):
            return None
        return samples if samples and all(entry and all(len(s) == 3 and min(s) > 0 for s in entry) for entry in samples) else None

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | Declined | None:
        shapes, x = self.shapes(args, kwargs), self.tokens(args, kwargs)
        if not isinstance(x, torch.Tensor) or x.ndim != 6 or not isinstance(shapes, (tuple, list)):
            return None
        samples = self._samples(shapes)
        if samples is None or any(s != samples[0] for s in samples) or sum(math.prod(s) for s in samples[0]) != x.shape[1]:
            if not self.warned:
                self.warned = True
                warn_at_caller(
                    f"tokenmerge: JoyImage Edit Plus: shape_list {shapes!r} is not one list of (t, h, w) shared by the batch "
                    f"and adding up to the {x.shape[1]} tokens of hidden_states; such calls run unchanged"
                )
            return DECLINED
        grids = [self._grid(s) for s in samples[0]]
        return TokenLayout.joint(("image", "reference", "text"), grids[0], text_length(self.text(args, kwargs)), tuple(grids[1:]))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "warned": False}


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [joint_block(b, mlps=("img_mlp",), follows=FOLLOWS) for b in getattr(module, "double_blocks", [])]
    if not blocks:
        return None
    return DenoiserLayout(module, [Container(module, blocks, 1, ShapeList(module))], "joyimage-edit-plus", single_level=True)


FAMILIES = (
    Family(
        name="joyimage-edit",
        title="JoyImage Edit",
        classes=("JoyImageEditTransformer3DModel",),
        pipelines=("JoyImageEditPipeline",),
        refused="its attention gets the rotary tables nested ((image cos, sin), (text cos, sin)), without a batch "
        "dimension, and reshapes them with view: a merge of its image tokens cannot hand it each sample's kept rows",
    ),
    Family(
        name="joyimage-edit-plus",
        title="JoyImage Edit Plus",
        classes=("JoyImageEditPlusTransformer3DModel",),
        layout=layout,
        pipelines=("JoyImageEditPlusPipeline",),
        notes="grid and edit references: shape_list (python lists, no host read; the target, then references, never "
        "reduced); text: encoder_hidden_states, after the image; rotary: image_rotary_emb (cos, sin), each (B, N, D), "
        "gathered at each sample's kept rows; mask: attention_mask (B, 1, 1, N + T), its columns follow; samples with "
        "different shape_list run unchanged",
    ),
)
