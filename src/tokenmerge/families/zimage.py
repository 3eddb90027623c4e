"""Z-Image (Turbo, base; ``ZImageTransformer2DModel``): a single-stream DiT over [image; caption].

The root takes per-sample lists: ``x`` (B tensors (C, F, H, W)) and ``cap_feats`` (B tensors (L_i, D), the
text padding already stripped, so the lengths differ per sample: the pipeline batches the prompt and the
negative prompt in one call). Each sample's image tokens (row-major over the 2x2 patch grid) are padded to a
multiple of 32 with a learned pad token, its caption likewise; the main ``layers`` see, per sample,
[image N; image padding X - N; caption C_i (padded)] and batch padding up to X + max C_i, masked by a (B, S)
``attention_mask`` (None when every sample has the same length). The image is at offset 0 with the same N in
every sample, so one call has one layout: image N, then the image padding as a segment of its own that is never
reduced (kind "padding", kept in the image stream), then max C_i "text" tokens (captions, their padding, batch padding).

Patched: the main ``layers`` (joint stream) and the image-only ``noise_refiner`` (image stream: image and its
padding); the caption-only ``context_refiner`` runs as it is. In each block the attention and the feed-forward
are merged spans. Rotary positions (``freqs_cis``, (B, S, head_dim / 2) complex, one row per token and sample)
are applied inside the processor: they follow a merge per sample (a merged token takes its destination's row);
so does the key-padding mask (``attention_mask``, (B, S)). Keys and values are downsampled in front of the
diffusers dispatch backend, after the rotary, with the mask's key columns following. Omni calls (``x`` a list of
lists: [caption; images; SigLIP] per sample, per-token modulation) run unchanged, with a one-time warning; so do
calls whose images differ in size. ``ZImageControlNetModel`` is not patched (it shares the refiners with the
transformer; blocks called outside a transformer call run unchanged).
"""

from __future__ import annotations

import math

import torch

from ..algorithms import Segment, TokenGrid, TokenLayout
from ..notices import warn_at_caller
from . import Family
from .base import DECLINED, Argument, BlockLayout, ComfyModel, Container, DenoiserLayout, Follow, KeyValueSite, Span
from .lumina2 import NEXTDIT_LAYERS

SEQ_MULTI_OF = 32  # diffusers' transformer_z_image.SEQ_MULTI_OF: image and caption lengths are padded to it
# The kind of the image's padding rows: neither text (the image stream holds them) nor a reference image (no grid,
# no edit); every hook leaves a segment of a kind other than the target "image" where it is, whole.
PADDING = "padding"


def padded(n: int) -> int:
    return SEQ_MULTI_OF * math.ceil(n / SEQ_MULTI_OF)


def block(module: torch.nn.Module, stream: str) -> BlockLayout:
    """A ``ZImageTransformerBlock``: attention (its input is ``attention_norm1(x) * scale``) and feed-forward, each a
    merged span over ``stream``; the rotary table and the mask passed to the attention follow the merge."""
    attention, mlp = module.attention, module.feed_forward
    follows = ((attention, Follow("freqs_cis", dim=1, stream=stream)), (attention, Follow("attention_mask", dim=-1, stream=stream)))
    spans = [
        Span("merge_attn", attention, attention, stream=stream, follows=follows, name="attention"),
        Span("merge_mlp", mlp, mlp, stream=stream, name="feed_forward"),
    ]
    return BlockLayout(
        module, spans, [KeyValueSite(attention, stream=stream)], input_name="x", input_stream=stream, kind=type(module).__name__
    )


class ZImageLayout:
    """[image; image padding; text] of a basic-mode call, from ``x`` (the image grid) and ``cap_feats`` (the
    caption lengths); ``None`` (once warned) for omni calls and for images of different sizes. No host sync:
    everything is read from shapes and list lengths."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.x, self.text = Argument(root, "x"), Argument(root, "cap_feats")
        self.patch, self.f_patch = Argument(root, "patch_size"), Argument(root, "f_patch_size")
        self.warned: set[str] = set()

    def _warn(self, key: str, message: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            warn_at_caller(f"tokenmerge: Z-Image {message}; such calls run unchanged")

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        x, text = self.x(args, kwargs), self.text(args, kwargs)
        if not isinstance(x, (list, tuple, torch.Tensor)) or len(x) == 0 or not isinstance(text, (list, tuple, torch.Tensor)):
            return None
        if isinstance(x[0], (list, tuple)):
            self._warn("omni", "omni calls (condition images, SigLIP features: [caption; images] per sample)")
            return DECLINED
        shapes = {tuple(image.shape) for image in x}
        if len(shapes) != 1 or len(next(iter(shapes))) != 4:
            self._warn("sizes", f"calls whose images differ in size ({sorted(shapes)})")
            return DECLINED
        _, f, h, w = next(iter(shapes))
        p, pf = self.patch(args, kwargs) or 2, self.f_patch(args, kwargs) or 1
        shape, patch = ((h // p, w // p), (p, p)) if f // pf == 1 else ((f // pf, h // p, w // p), (pf, p, p))
        grid = TokenGrid(shape, patch=patch)
        n = grid.numel
        segments = [Segment("image", n, grid)]
        if padded(n) > n:
            segments.append(Segment(PADDING, padded(n) - n))  # the learned pad token's rows: kept, never reduced
        caption = max((padded(len(c)) for c in text), default=0)
        if caption:
            segments.append(Segment("text", caption))
        return TokenLayout(tuple(segments))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "warned": set()}


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [block(b, "image") for b in getattr(module, "noise_refiner", [])]
    blocks += [block(b, "joint") for b in getattr(module, "layers", [])]
    if not blocks:
        return None
    return DenoiserLayout(module, [Container(module, blocks, 1, ZImageLayout(module))], "z-image", single_level=True)


FAMILY = Family(
    name="z-image",
    title="Z-Image",
    timesteps=(0.0, 1.0),  # the pipeline passes (1000 - t) / 1000: 0 is pure noise
    classes=("ZImageTransformer2DModel",),
    layout=layout,
    pipelines=(
        "ZImagePipeline",
        "ZImageImg2ImgPipeline",
        "ZImageInpaintPipeline",
        "ZImageControlNetPipeline",
        "ZImageControlNetInpaintPipeline",
    ),
    # 512: the pipeline's max_sequence_length (the caption's padding is stripped: real prompts are shorter).
    notes="grid: x, per-sample list of (C, 1, H, W) over 2x2 patches, first in the sequence (offset 0 in every sample); "
    "the image's padding to a multiple of 32 is a segment of its own, never reduced; text: cap_feats lengths padded to "
    "32, the batch's longest, after the image; main layers (joint) and noise_refiner (image) patched, context_refiner "
    "not; rotary: freqs_cis (B, S, D/2) complex and the (B, S) attention_mask gathered per sample; omni calls and "
    "images of different sizes run unchanged",
    comfy=ComfyModel(
        ("NextDiT",),
        "Z-Image",
        image_models=("lumina2",),
        padded_by="pad_tokens_multiple",
        notes="comfy/ldm/lumina (0.33): Lumina 2's NextDiT with pad_tokens_multiple: [caption + pad; image + pad] to "
        "multiples of 32, the image last (after references and SigLIP tokens in omni calls); q, k, v after the rotary",
        blocks=NEXTDIT_LAYERS,
    ),
)
