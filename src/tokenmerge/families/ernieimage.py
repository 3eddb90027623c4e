"""ERNIE-Image: refused, with the reason.

``ErnieImageTransformer2DModel`` runs its ``layers`` (``ErnieImageSharedAdaLNBlock``) on the joint [image; text]
sequence laid out sequence-first, (S, B, C), with a per-token copy of the modulation; only the attention inside each
layer sees the tokens batch-first. A block tokenmerge matches tokens on must take them (B, N, C), and a block
gradient checkpointing recomputes in backward is found again by that input: merging around the attention alone works
for inference (tested), but the attention's input is recomputed anew inside a checkpointed layer, so its forward
call's merge cannot be found (the conformance suite's gradient checkpointing test fails). Supporting it needs the
core to take a sequence-first block input.
"""

from __future__ import annotations

from . import Family

FAMILY = Family(
    name="ernie-image",
    title="ERNIE-Image",
    classes=("ErnieImageTransformer2DModel",),
    pipelines=("ErnieImagePipeline",),
    refused="its blocks take the joint sequence sequence-first (S, B, C), batch-first only inside their attention: a "
    "merge around that attention alone cannot be matched to its call when gradient checkpointing recomputes the block",
)
