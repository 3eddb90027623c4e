"""OmniGen (v1): a Phi-3 decoder over one sequence [condition; time token; image], as single-stream blocks.

``OmniGenBlock``: RMSNorm, self-attention (``self_attn``, the normalised sequence handed as both its queries' and its
keys' source), RMSNorm, gated MLP, each with a residual. Merged: the image segment of the joint sequence from
``input_layernorm``'s output to ``self_attn``'s (so that the attention's key source is the merged tensor too), and
around ``mlp``.

Token layout, read at the root without a host sync:

- grid: ``hidden_states`` (B, C, H, W) over ``patch_size``: an (h, w) grid, last in the sequence.
- condition: the ``input_ids`` tokens (the prompt, with any input images' tokens written into its placeholders) and
  the time token, first: one segment, never reduced.
- rotary: the model's (cos, sin), each (N, D) over the joint sequence (the first sample's positions), no batch
  dimension: gathered at each sample's kept rows.
- mask: the processor's (B, 1, N, N) mask (causal over the condition, bidirectional over the image) follows the merge
  in both its query rows and its key columns.

Keys and values (todo/auto) are reduced at SDPA, after the rotary embedding, the mask's key columns with them.
"""

from __future__ import annotations

import torch

from ..algorithms import TokenGrid, TokenLayout
from . import Family
from .base import Argument, BlockLayout, Container, DenoiserLayout, Follow, KeyValueSite, Span

ROTARY = Follow("image_rotary_emb", dim=0, stream="joint")
FOLLOWS = (ROTARY, Follow("attention_mask", dim=-1, stream="joint"), Follow("attention_mask", dim=-2, stream="joint"))


class OmniGenLayout:
    """[condition; time token; image] from ``input_ids`` (B, L) and ``hidden_states`` (B, C, H, W)."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.tokens, self.ids, self.patch = Argument(root, "hidden_states"), Argument(root, "input_ids"), root.config.patch_size

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        x, ids, p = self.tokens(args, kwargs), self.ids(args, kwargs), self.patch
        if not isinstance(x, torch.Tensor) or x.ndim != 4:
            return None
        condition = ids.shape[1] if isinstance(ids, torch.Tensor) and ids.ndim == 2 else 0
        return TokenLayout.joint(("text", "image"), TokenGrid((x.shape[2] // p, x.shape[3] // p), patch=(p, p)), condition + 1)


def block(module: torch.nn.Module) -> BlockLayout:
    attn, mlp = module.self_attn, module.mlp
    spans = [
        Span(
            "merge_attn",
            module.input_layernorm,
            attn,
            enter_on_output=True,
            stream="joint",
            follows=tuple((attn, f) for f in FOLLOWS),
            name="self_attn",
        ),
        Span("merge_mlp", mlp, mlp, stream="joint", name="mlp"),
    ]
    return BlockLayout(module, spans, [KeyValueSite(attn, stream="joint")], input_stream="joint", kind=type(module).__name__)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [block(b) for b in getattr(module, "layers", []) if isinstance(getattr(b, "self_attn", None), torch.nn.Module)]
    if not blocks:
        return None
    return DenoiserLayout(module, [Container(module, blocks, 1, OmniGenLayout(module))], "omnigen", single_level=True)


FAMILY = Family(
    name="omnigen",
    title="OmniGen",
    classes=("OmniGenTransformer2DModel",),
    layout=layout,
    pipelines=("OmniGenPipeline",),
    notes="grid: hidden_states (B, C, H, W) / patch_size, last; condition (input_ids, with input images' tokens) and the "
    "time token first, never reduced; rotary: the model's (cos, sin) over the joint sequence, gathered at each sample's "
    "kept rows; the (B, 1, N, N) mask follows in rows and columns",
)
