"""Lumina-Image 2.0 (``Lumina2Transformer2DModel``): a single-stream DiT over [caption; image].

The root takes the (B, C, H, W) latent, the caption (B, L, D), right-padded, and its (B, L) mask. The main
``layers`` see, per sample, [valid caption c_i; image N (row-major over 2x2 patches)] and zero padding up to
max c_i + N, masked by a (B, S) ``attention_mask`` only where the c_i differ. So the image's offset is c_i: one
layout per call exists only when every sample has the same caption length (one prompt: the pipeline's calls,
cond and uncond separately, with ``num_images_per_prompt`` copies). A call whose samples have captions of
different lengths runs unchanged, with a one-time warning (a layout holds one offset per call, not per sample).
The lengths are read with one host sync per call (the model reads them itself, too).

Patched: the main ``layers`` (joint stream) and the image-only ``noise_refiner`` (image stream); the
caption-only ``context_refiner`` runs as it is. The attention's queries, keys and values all come from
``norm1``'s output (passed as both ``hidden_states`` and ``encoder_hidden_states``), so the attention span is
merged from ``norm1``'s output (element 0) to the attention's output; the feed-forward is a span of its own.
Rotary positions (``image_rotary_emb``, (B, S, head_dim / 2) complex, per sample) are applied to queries and
keys inside the processor and follow a merge per sample, as does the key-padding mask. The processor calls
torch's ``scaled_dot_product_attention`` itself: keys and values are downsampled there, after the rotary and the
grouped-query repeat.
"""

from __future__ import annotations

import torch

from ..algorithms import TokenGrid, TokenLayout
from ..notices import warn_at_caller
from . import Family
from .base import (
    DECLINED,
    Argument,
    BlockLayout,
    ComfyBlocks,
    ComfyModel,
    Container,
    DenoiserLayout,
    Follow,
    KeyValueSite,
    Span,
    config_int,
    text_length,
)

# ComfyUI's NextDiT (Lumina 2, Z-Image) offers no block replace patches: the forwards of its image refiner and main
# layers are wrapped for each call, layer(x, mask, freqs_cis, adaln_input) over the image (and its padding) and the
# joint [caption; image] sequence, the rotary rows along axis 1 (as the diffusers path, the caption refiner whole)
NEXTDIT_LAYERS = ComfyBlocks((("noise_refiner", "noise_refiner"), ("layer", "layers")), joint=("layer",), pe_dims=(1,), wrapped=True)


def block(module: torch.nn.Module, stream: str) -> BlockLayout:
    """A ``Lumina2TransformerBlock``: attention from ``norm1``'s output (element 0 of its tuple where the block is
    modulated) to ``attn``'s output, and the feed-forward, each a merged span over ``stream``."""
    attn, mlp = module.attn, module.feed_forward
    follows = ((attn, Follow("image_rotary_emb", dim=1, stream=stream)), (attn, Follow("attention_mask", dim=-1, stream=stream)))
    index = 0 if getattr(module, "modulation", True) else None
    spans = [
        Span("merge_attn", module.norm1, attn, enter_on_output=True, enter_index=index, stream=stream, follows=follows, name="norm1+attn"),
        Span("merge_mlp", mlp, mlp, stream=stream, name="feed_forward"),
    ]
    return BlockLayout(module, spans, [KeyValueSite(attn, stream=stream)], input_stream=stream, kind=type(module).__name__)


class Lumina2Layout:
    """[text c; image] of a call whose samples all have c valid caption tokens (``encoder_attention_mask``); the
    grid from ``hidden_states`` (B, C, H, W) over ``patch_size`` patches. ``None`` (once warned) where the
    samples' caption lengths differ."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.tokens, self.text = Argument(root, "hidden_states"), Argument(root, "encoder_hidden_states")
        self.mask = Argument(root, "encoder_attention_mask")
        self.patch_size = config_int(root, "patch_size", 2)
        self.warned = False

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        x, mask = self.tokens(args, kwargs), self.mask(args, kwargs)
        if not isinstance(x, torch.Tensor) or x.ndim != 4:
            return None
        if isinstance(mask, torch.Tensor) and mask.ndim == 2:
            lengths = set(mask.sum(1).tolist())
        else:
            lengths = {text_length(self.text(args, kwargs))}
        if len(lengths) != 1:
            if not self.warned:
                self.warned = True
                warn_at_caller(
                    f"tokenmerge: Lumina2 calls whose samples have captions of different lengths ({sorted(lengths)} tokens) "
                    "run unchanged: the image starts after each sample's caption, at an offset of its own",
                )
            return DECLINED
        p = self.patch_size
        grid = TokenGrid((x.shape[-2] // p, x.shape[-1] // p), patch=(p, p))
        return TokenLayout.joint(("text", "image"), grid, int(lengths.pop()))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "warned": False}


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [block(b, "image") for b in getattr(module, "noise_refiner", [])]
    blocks += [block(b, "joint") for b in getattr(module, "layers", [])]
    if not blocks:
        return None
    return DenoiserLayout(module, [Container(module, blocks, 1, Lumina2Layout(module))], "lumina2", single_level=True)


FAMILY = Family(
    name="lumina2",
    title="Lumina-Image 2.0",
    timesteps=(0.0, 1.0),  # the pipeline passes 1 - t / 1000: 0 is pure noise
    classes=("Lumina2Transformer2DModel",),
    layout=layout,
    pipelines=("Lumina2Pipeline",),
    # 256: the pipeline's max_sequence_length (the caption is padded to it; the sequence holds its valid tokens).
    notes="grid: hidden_states (B, C, H, W) / patch_size; text: the valid caption tokens (encoder_attention_mask, one "
    "host read per call), first; calls whose samples' caption lengths differ run unchanged; main layers (joint) and "
    "noise_refiner (image) patched, context_refiner not; rotary: image_rotary_emb (B, S, D/2) complex gathered per "
    "sample; keys and values downsampled at torch's scaled_dot_product_attention",
    comfy=ComfyModel(
        ("NextDiT",),
        "Lumina 2",
        notes="comfy/ldm/lumina: q, k, v (B, H, S, D) after the rotary embedding; the image refiner's self-attention "
        "(its padding mask's columns follow), the joint [caption; image] layers; the caption refiner left alone",
        blocks=NEXTDIT_LAYERS,
    ),
)
