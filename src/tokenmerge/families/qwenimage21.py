"""Qwen-Image 2.1: refused (not supported yet), with the reason.

``QwenImage21Transformer2DModel`` is single-stream and block-causal: one sequence interleaves text with the
condition images' tokens (where the vision-language encoder reserved their slots) and appends the target image
last; the sequence is causal while each image block is bidirectional. The default processor
(``QwenImage21AttnProcessor``) runs one attention call per prefix segment and then the target image's queries alone
against [prefix; target] keys; the flex processor runs one call with a ``BlockMask``, which cannot follow a merge
or a key reduction. With the pipeline's default key/value cache (``use_kv_cache=True`` with ``causal_condition``),
every step after the first is a ``kv_cache_mode="cached"`` call whose blocks see the target alone while their keys
are [cached prefix; target], the prefix coming from the cache rather than from the sequence.

What patching it would take (measured on the tiny model, not shipped): the target is the last
``prod(img_shapes[0][-1])`` tokens; merging them around ``attn`` and ``img_mlp`` with ``rotary_emb`` (rows, no batch
dimension), ``key_valid`` (B, S) and, in cached calls, ``attention_mask`` (B, 1, 1, P + T) gathered at the kept
rows, and reducing the target keys of the target's attention call at the dispatch route, both work with the
existing hooks, in prefill and cached calls, the prefix calls untouched. What holds it back: the conformance suite
recognises the attention to check by its queries and keys being one sequence, which the target's call never is
here (its queries are the target, its keys the prefix and the target), and the cached calls' layout has to present
the cached prefix as a segment of the keys outside the block's sequence (the "text" kind, while the prefill's text
is inside it). Until both are settled it is refused rather than patched unchecked.
"""

from __future__ import annotations

from . import Family

REASON = (
    "not supported yet: its attention is block-causal over one sequence that interleaves text and condition images and "
    "appends the target, whose queries attend in a call of their own (against a key/value-cached prefix on every step "
    "after the first, the pipeline's default), a shape tokenmerge's checks do not cover yet"
)
FAMILY = Family(
    name="qwen-image-2.1",
    title="Qwen-Image 2.1",
    classes=("QwenImage21Transformer2DModel",),
    pipelines=("QwenImage21Pipeline",),
    refused=REASON,
)
