"""AnyFlow (flow-map distillations of Wan 2.1): refused, each with the reason.

``AnyFlowFARTransformer3DModel`` (chunk-wise autoregressive generation) has causal self-attention: its processor
(``AnyFlowCausalAttnProcessor``) attends through a flex-attention ``BlockMask`` over compressed and full-resolution
frame chunks, and through a key/value cache (``kv_cache``) that the calls of a generation write and read. A merged
or reduced sequence would no longer line up with the mask's blocks, nor with the keys cached by earlier calls.

``AnyFlowTransformer3DModel`` (bidirectional) is Wan's self+cross block on a (B, F, C, H, W) latent with a per-token
modulation; its self-attention is not causal and caches nothing, but its rotary table reaches the attention as a dict
(``{"query": ..., "key": ...}``, complex (1, 1, N, D/2) tables), which the merge cannot gather: its tokens could not
be merged (its keys and values could be reduced), so it is refused rather than supported by half.
"""

from __future__ import annotations

from . import Family

FAMILIES = (
    Family(
        name="anyflow",
        title="AnyFlow",
        classes=("AnyFlowTransformer3DModel",),
        pipelines=("AnyFlowPipeline",),
        refused="not supported yet: its rotary table reaches the self-attention as a dict of query and key tables, "
        "which a merge of its tokens cannot follow",
    ),
    Family(
        name="anyflow-far",
        title="AnyFlow FAR",
        classes=("AnyFlowFARTransformer3DModel",),
        pipelines=("AnyFlowFARPipeline",),
        refused="its self-attention is causal (a flex-attention BlockMask over frame chunks) and its keys and values are "
        "cached across calls (kv_cache): a merged or reduced sequence would not line up with the mask or the cached keys",
    ),
)
