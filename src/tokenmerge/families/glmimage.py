"""GLM-Image (``GlmImageTransformer2DModel``, the diffusion decoder of zai-org/GLM-Image): CogView4-style joint
blocks over [text; image].

``GlmImageTransformerBlock``: one joint attention (``attn1``) takes the image and the glyph text separately; its
processor concatenates [text; image], applies the 2-D rotary table to the image rows of the queries and keys, calls
``dispatch_attention_fn`` and returns ``(image, text)``. The one MLP (``ff``) is then called twice, on the image
stream and on the text stream, so a merge cannot start at its input: the image stream is merged around ``attn1`` and
from the image's ``norm2`` output (the text has ``norm2_context``) to ``ff``'s output, which the image call leaves
first. The autoregressive model's prior tokens (``prior_token_id``, one per image token) are embedded and added to
the image tokens before the blocks, so they need nothing.

Token layout, read at the root without a host sync:

- grid: ``hidden_states`` (B, C, H, W) over ``patch_size``.
- text: ``encoder_hidden_states`` (glyph embeddings), first in the joint sequence, never reduced.
- rotary: ``image_rotary_emb = (cos, sin)``, each (N, D), image rows only, no batch dimension; gathered at each
  sample's kept rows.
- mask: ``attention_mask`` (B, T) covers the text only (the pipeline passes none); the processor widens it with ones
  over however many image tokens it is handed, so it needs no gathering.

Edits: the pipeline first runs each condition image through the model with ``kv_caches`` in "write" mode and then
denoises with them in "read" mode, where every attention prepends the cached keys and values of the condition
images (held across calls) to its own. Such calls (any layer's cache in "write" or "read" mode) run unchanged, with
a one-time warning: a write of merged tokens would cache keys of the wrong tokens, and read calls attend to keys no
layout of the call describes. Text-to-image calls pass caches with no mode and are reduced.

Keys and values (todo/auto) are reduced at ``dispatch_attention_fn``, after the rotary embedding.
"""

from __future__ import annotations

import torch

from ..algorithms import TokenLayout
from ..notices import warn_at_caller
from . import Family
from .base import DECLINED, Argument, BlockLayout, Container, DenoiserLayout, Follow, ImageGrid, KeyValueSite, Span, config_int

ROTARY = Follow("image_rotary_emb", dim=0, stream="image")


def block(module: torch.nn.Module) -> BlockLayout:
    attn, norm, ff = module.attn1, module.norm2, module.ff
    spans = [
        Span("merge_attn", attn, attn, leave_index=0, follows=((attn, ROTARY),), name="attn1"),
        Span("merge_mlp", norm, ff, enter_on_output=True, name="norm2+ff"),
    ]
    return BlockLayout(module, spans, [KeyValueSite(attn, stream="joint")], kind=type(module).__name__)


class GlmImageLayout:
    """[text; image] of a text-to-image call (:class:`ImageGrid`); ``DECLINED`` (once warned) for the edit calls that
    write or read the condition images' cached keys and values."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.caches = Argument(root, "kv_caches")
        self.grid = ImageGrid(config_int(root, "patch_size", 2), Argument(root, "encoder_hidden_states"), ("text", "image"))
        self.warned = False

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        caches = self.caches(args, kwargs)
        if any(getattr(cache, "mode", None) in ("write", "read") for cache in getattr(caches, "caches", ())):
            if not self.warned:
                self.warned = True
                warn_at_caller(
                    "tokenmerge: GLM-Image calls that write or read the condition images' cached keys and values "
                    "(kv_caches, image edits) run unchanged",
                )
            return DECLINED
        return self.grid(args, kwargs)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "warned": False}


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [block(b) for b in getattr(module, "transformer_blocks", [])]
    if not blocks:
        return None
    return DenoiserLayout(module, [Container(module, blocks, 1, GlmImageLayout(module))], "glm-image", single_level=True)


FAMILY = Family(
    name="glm-image",
    title="GLM-Image",
    classes=("GlmImageTransformer2DModel",),
    layout=layout,
    pipelines=("GlmImagePipeline",),
    notes="grid: hidden_states (B, C, H, W) / patch_size; text: encoder_hidden_states, first in the joint sequence; "
    "rotary: image_rotary_emb (cos, sin), image rows, gathered at each sample's kept rows; the text-only attention_mask "
    "needs no gathering; edit calls (kv_caches in write or read mode: condition images' keys cached across calls) run "
    "unchanged",
)
