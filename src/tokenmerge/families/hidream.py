"""HiDream-I1 (Full, Dev, Fast): dual-stream blocks, then single-stream blocks, each wrapped in a ``HiDreamBlock``
(``.block`` is the real block), over [image; text] with a mixture-of-experts feed-forward.

``HiDreamImageTransformerBlock``s: the image stream meets the text in ``attn1``, called positionally as
``attn1(image, hidden_states_masks, text, image_rotary_emb=rope)`` (image output first); the image stream is merged
around ``attn1`` and around its feed-forward ``ff_i`` (a token-wise MoE: routing is per token, so merged tokens
are only fewer rows). ``HiDreamImageSingleTransformerBlock``s get [image; text] concatenated by the root and run
``attn1`` then ``ff_i`` one after the other on the joint sequence: each is a merged span of its own. Both kinds
see the same text: T5 tokens, the last Llama layer's tokens and the block's own Llama layer's tokens (T5 + 2 x
Llama tokens), after the image. The processor calls torch's ``scaled_dot_product_attention`` itself, where keys
and values are downsampled.

Grid: the (B, C, H, W) latent over its 2x2 patches, read from the root's ``hidden_states`` (no host read); text:
``encoder_hidden_states_t5`` and ``encoder_hidden_states_llama3`` (the stack of every Llama layer, or a list of
them) at the root. Rotary: one table per sample, (B, S, 1, D/2, 2, 2), rows [image; text], gathered per sample at
each sample's kept rows.

Non-square latents: the root pads the image tokens to ``max_seq`` (its largest grid) with zero tokens and hands
every attention ``hidden_states_masks`` (1 on the image, 0 on the padding; ones over the text in the single
blocks), which zeroes the padded keys. Policy: the padding is a segment of its own after the image ("padding",
never reduced, like a reference image's tokens): ToMe merges only the real image tokens and the mask follows the
merge (its image-stream rows in the dual-stream blocks, its joint rows in the single-stream blocks); ToDo
downsamples only the real image keys and keeps the padded ones as the model has them. Calls that pass the
pre-patchified form themselves (``hidden_states_masks`` / ``img_ids`` / ``img_sizes``, possibly a different size
per sample) run unchanged, with a warning.
"""

from __future__ import annotations

from typing import Any

import torch

from ..algorithms import Segment, TokenGrid, TokenLayout
from ..notices import warn_at_caller
from . import Family
from .base import (
    DECLINED,
    Argument,
    BlockLayout,
    ComfyModel,
    Container,
    DenoiserLayout,
    Follow,
    KeyValueSite,
    Span,
    config_int,
    joint_block,
)

ROTARY = Follow("image_rotary_emb", dim=1, stream="joint")
IMAGE_MASK = Follow("hidden_states_masks", dim=1, stream="image")  # dual-stream blocks: the mask covers the image stream
JOINT_MASK = Follow("hidden_states_masks", dim=1, stream="joint")  # single-stream blocks: [image; padding; text]


class HiDreamLayout:
    """[image; padding; text] of a HiDream call: the image grid from the (B, C, H, W) latent, the padding to
    ``max_seq`` that the root adds to non-square latents, and T5 + 2 x Llama text tokens."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.tokens = Argument(root, "hidden_states")
        self.t5 = Argument(root, "encoder_hidden_states_t5")
        self.llama = Argument(root, "encoder_hidden_states_llama3")
        self.masks = Argument(root, "hidden_states_masks")
        self.patch_size = config_int(root, "patch_size", 2)
        self.max_seq = int(getattr(root, "max_seq", 0))
        self.warned = False

    def _llama_tokens(self, llama: Any, batch: int) -> int:
        layer = llama[0] if isinstance(llama, (list, tuple, torch.Tensor)) and len(llama) else None  # as the root indexes it
        if not isinstance(layer, torch.Tensor) or layer.ndim < 2:
            return 0
        return layer.numel() // (batch * layer.shape[-1])  # the root views each layer as (B, -1, C)

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        x = self.tokens(args, kwargs)
        if not isinstance(x, torch.Tensor):
            return None
        if x.ndim != 4 or self.masks(args, kwargs) is not None:
            if not self.warned:
                self.warned = True
                warn_at_caller(
                    "tokenmerge: HiDream calls with pre-patchified hidden_states (hidden_states_masks, img_ids, img_sizes) run unchanged",
                )
            return DECLINED
        p = self.patch_size
        grid = TokenGrid((x.shape[-2] // p, x.shape[-1] // p), patch=(p, p))
        padding = self.max_seq - grid.numel if x.shape[-2] != x.shape[-1] else 0
        if padding < 0:  # larger than the model's max_resolution: the model itself refuses it
            return None
        t5 = self.t5(args, kwargs)
        text = (t5.numel() // (x.shape[0] * t5.shape[-1]) if isinstance(t5, torch.Tensor) else 0) + 2 * self._llama_tokens(
            self.llama(args, kwargs), x.shape[0]
        )
        segments = [Segment("image", grid.numel, grid)]
        if padding:
            segments.append(Segment("padding", padding))
        if text:
            segments.append(Segment("text", text))
        return TokenLayout(tuple(segments))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "warned": False}


def double_block(wrapper: torch.nn.Module) -> BlockLayout:
    block = getattr(wrapper, "block", wrapper)
    return joint_block(block, attention="attn1", mlps=("ff_i",), follows=(ROTARY, IMAGE_MASK))


def single_block(wrapper: torch.nn.Module) -> BlockLayout:
    block = getattr(wrapper, "block", wrapper)
    attn, ff = block.attn1, block.ff_i
    spans = [
        Span("merge_attn", attn, attn, stream="joint", follows=((attn, ROTARY), (attn, JOINT_MASK)), name="attn1"),
        Span("merge_mlp", ff, ff, stream="joint", name="ff_i"),
    ]
    return BlockLayout(block, spans, [KeyValueSite(attn, stream="joint")], input_stream="joint", kind=type(block).__name__)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [double_block(b) for b in getattr(module, "double_stream_blocks", [])]
    blocks += [single_block(b) for b in getattr(module, "single_stream_blocks", [])]
    return DenoiserLayout(module, [Container(module, blocks, 1, HiDreamLayout(module))], "hidream", single_level=True) if blocks else None


FAMILY = Family(
    name="hidream",
    title="HiDream-I1",
    classes=("HiDreamImageTransformer2DModel",),
    layout=layout,
    pipelines=("HiDreamImagePipeline",),
    notes="grid: hidden_states (B, C, H, W) / patch_size, non-square latents padded to max_seq (a padding segment, "
    "never reduced; hidden_states_masks follows a merge); text: encoder_hidden_states_t5 + 2 x Llama tokens "
    "(encoder_hidden_states_llama3), after the image in every block; rotary: image_rotary_emb (B, S, 1, D/2, 2, 2) "
    "rows [image; text], gathered per sample",
    comfy=ComfyModel(
        ("HiDreamImageTransformer2DModel",),
        "HiDream",
        image="first",
        declines=("image_cond",),
        notes="comfy/ldm/hidream: q, k, v (B, S, H*D) after the rotary embedding, [image; T5; Llama layers]",
    ),
)
