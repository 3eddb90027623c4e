"""SANA and its relatives: refused, with the reason.

Their self-attention is linear (``SanaLinearAttnProcessor*``: ReLU kernels, cost linear in the token count, no
N x N matrix), their cross-attention attends to text keys only, and their feed-forward is a convolution over the
image grid (a merged sequence has no grid for it). Fewer keys or merged tokens save next to nothing there and the
convolutions cannot run on them, so tokenmerge declines rather than patch for no gain.
"""

from __future__ import annotations

from . import Family

FAMILY = Family(
    name="sana",
    title="SANA",
    classes=("SanaTransformer2DModel", "SanaControlNetModel", "SanaVideoTransformer3DModel", "SanaWMTransformer3DModel"),
    pipelines=("SanaPipeline", "SanaSprintPipeline", "SanaVideoPipeline"),
    refused="its self-attention is linear in the token count (SanaLinearAttnProcessor) and its feed-forward is a convolution "
    "over the image grid: reducing tokens saves next to nothing there and a merged sequence has no grid for the convolution",
)
