"""SANA-WM's stage-2 refiner (``SanaWMLTX2RefinerTransformer3DModel``): refused, with the reason.

Its blocks are LTX-2's video blocks, but its self-attention (``SanaWMLTX2RefinerAttnProcessor``) is chunk-causal
autoregressive: each call denoises one block of latent frames whose queries attend to ``[attention sink; recent
history; active block]``, the sink's and the history's keys and values read from a ``SanaWMRefinerKVCache`` that
earlier calls wrote (``kv_cache_mode`` "capture_pre_rope", "inject", "inject_and_capture_post_rope"). A merged or
reduced sequence would write reduced keys into the cache that later chunks read as whole frames, and the cache's
captured keys would no longer line up with their positions, so tokenmerge declines rather than patch it.
"""

from __future__ import annotations

from . import Family

FAMILY = Family(
    name="sana-wm-refiner",
    title="SANA-WM refiner",
    classes=("SanaWMLTX2RefinerTransformer3DModel",),
    pipelines=("SanaWMLTX2Refiner",),
    refused="its self-attention is chunk-causal: each call's frames attend to sink and history keys and values cached by "
    "earlier calls (kv_cache, captured and injected by kv_cache_mode), which a merged or reduced sequence would write "
    "and read out of line with their frames and positions",
)
