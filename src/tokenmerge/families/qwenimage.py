"""Qwen-Image (and its Edit, Edit Plus, Layered variants, 2512 / 2511) and its ControlNet.

``QwenImageTransformerBlock``s are dual-stream (MMDiT) blocks: the image stream (``img_mod``, ``img_norm1/2``,
``img_mlp``) and the text stream (``txt_*``) meet in one joint attention whose processor concatenates
[text; image] and returns ``(image, text)`` (the image output is element 0; the block itself returns
``(text, image)``). The image stream is merged around ``attn`` and ``img_mlp``, after the block's modulation and
before its gates, so ``modulate_index`` (Edit 2511's ``zero_cond_t``) never needs to follow a merge.

Token layout, read from the root's call without a host sync:

- grid: ``img_shapes``, a python list with one entry per sample, each a list of ``(frames, h, w)`` in patch tokens
  (the controlnet-inpaint pipeline passes the flat form, one ``(frames, h, w)`` per sample, read as one segment).
  The first entry is the generated image; the entries after it are reference images (Edit: the input image,
  Edit Plus: each input image), appended after the target in ``hidden_states``: segments of their own, never
  reduced. Layered generates several layers: only its first layer is reduced, the other layers and the condition
  image are kept whole, as references. Samples whose ``img_shapes`` differ run unchanged (one warning): the model
  itself builds its rotary table from the first sample only, so such a batch has no single layout to merge by.
- text: ``encoder_hidden_states.shape[1]`` at the root (the padded length; ``encoder_hidden_states_mask`` masks
  keys, and its image part is rebuilt by the processor from the current image length, so it follows a merge).
- rotary: ``image_rotary_emb = (image table (N_image, D/2) complex, text table)`` is passed to the attention; its
  element 0 has one row per token of the image stream (target, then references) and no batch dimension: it is
  gathered at each sample's kept rows (a merged token takes its destination's row; hooks.tokens.SampleRows).

Keys and values (todo/auto) are reduced at ``dispatch_attention_fn`` (after the rotary embedding, so kept keys
keep their exact positions); the image key/value projections cannot see downsampled tokens, since the rotary
table is applied after them.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch

from ..algorithms import TokenGrid, TokenLayout
from ..notices import warn_at_caller
from . import Family
from .base import DECLINED, Argument, ComfyBlocks, ComfyModel, Container, DenoiserLayout, Follow, config_int, joint_block, text_length

ROTARY = Follow("image_rotary_emb", dim=0, stream="image", element=0)


def _segments(entry: Any) -> tuple[tuple[int, ...], ...] | None:
    """One sample's ``(frames, h, w)`` segments, from a list of them or a bare ``(frames, h, w)``."""
    if isinstance(entry, (tuple, list)) and len(entry) == 3 and all(isinstance(v, numbers.Integral) for v in entry):
        entry = [entry]
    if not isinstance(entry, (tuple, list)) or not entry:
        return None
    found = []
    for shape in entry:
        if not isinstance(shape, (tuple, list)) or len(shape) != 3:
            return None
        try:
            shape = tuple(int(v) for v in shape)
        except (TypeError, ValueError):
            return None
        if min(shape) < 1:
            return None
        found.append(shape)
    return tuple(found)


class ImageShapes:
    """The layout of a Qwen-Image call from its ``img_shapes`` (python lists: no host sync): [text; target;
    references], text length from ``encoder_hidden_states``. ``None`` (the call runs unchanged, one warning per
    cause) where the samples' shapes differ or do not add up to ``hidden_states``' tokens."""

    def __init__(self, root: torch.nn.Module, patch_size: int) -> None:
        self.shapes = Argument(root, "img_shapes")
        self.text = Argument(root, "encoder_hidden_states")
        self.tokens = Argument(root, "hidden_states")
        self.patch_size = patch_size
        self.warned: set[str] = set()

    def _warn(self, cause: str, message: str) -> None:
        if cause not in self.warned:
            self.warned.add(cause)
            warn_at_caller(f"tokenmerge: Qwen-Image: {message}; such calls run unchanged")

    def _grid(self, shape: tuple[int, ...]) -> TokenGrid:
        frames, h, w = shape
        p = self.patch_size
        return TokenGrid((h, w), patch=(p, p)) if frames == 1 else TokenGrid((frames, h, w), patch=(1, p, p))

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        shapes, x = self.shapes(args, kwargs), self.tokens(args, kwargs)
        if not isinstance(x, torch.Tensor) or x.ndim != 3 or not isinstance(shapes, (tuple, list)) or not shapes:
            return None
        samples = [_segments(entry) for entry in shapes]
        if any(s is None for s in samples):
            self._warn("unreadable", f"img_shapes {shapes!r} is not a list of (frames, height, width) per sample")
            return DECLINED
        first = samples[0]
        if any(s != first for s in samples[1:]):
            self._warn("mixed", f"the samples of a batch have different img_shapes ({shapes!r})")
            return DECLINED
        if sum(math.prod(s) for s in first) != x.shape[1]:
            self._warn("tokens", f"img_shapes {list(first)} do not add up to the {x.shape[1]} image tokens of hidden_states")
            return DECLINED
        grids = [self._grid(s) for s in first]
        return TokenLayout.joint(("text", "image", "reference"), grids[0], text_length(self.text(args, kwargs)), tuple(grids[1:]))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "warned": set()}


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [
        joint_block(b, mlps=("img_mlp",), follows=(ROTARY,))
        for b in getattr(module, "transformer_blocks", [])
        if isinstance(getattr(b, "attn", None), torch.nn.Module)
    ]
    if not blocks:
        return None
    reader = ImageShapes(module, config_int(module, "patch_size", 2))
    return DenoiserLayout(module, [Container(module, blocks, 1, reader)], "qwen-image", single_level=True)


FAMILY = Family(
    name="qwen-image",
    title="Qwen-Image",
    timesteps=(1.0, 0.0),  # the pipeline passes timestep / 1000
    classes=("QwenImageTransformer2DModel", "QwenImageControlNetModel", "QwenImageMultiControlNetModel"),
    layout=layout,
    pipelines=(
        "QwenImagePipeline",
        "QwenImageImg2ImgPipeline",
        "QwenImageInpaintPipeline",
        "QwenImageEditPipeline",
        "QwenImageEditInpaintPipeline",
        "QwenImageEditPlusPipeline",
        "QwenImageLayeredPipeline",
        "QwenImageControlNetPipeline",
        "QwenImageControlNetInpaintPipeline",
    ),
    notes="grid and edit references: img_shapes (python lists, no host read; entries after the first are references, "
    "after the target); text: encoder_hidden_states at the root, first; rotary: element 0 of image_rotary_emb "
    "(image rows, no batch dimension), gathered at each sample's kept rows; samples with different "
    "img_shapes run unchanged",
    comfy=ComfyModel(
        ("QwenImageTransformer2DModel",),
        "Qwen-Image",
        patch=(1, 2, 2),
        notes="comfy/ldm/qwen_image: q, k, v (B, S, H*D) after the rotary embedding, [text; image; edit references]; "
        "a (B, C, 1, H, W) latent",
        # "img": [image; edit references], pe rows [text; image; references]: (B, 1, S, D/2, 2, 2) in ComfyUI 0.33,
        # (B, S, 1, D/2, 2, 2) in 0.3.64
        blocks=ComfyBlocks((("double_block", "transformer_blocks"),), pe_dims=(2, 1)),
    ),
)
