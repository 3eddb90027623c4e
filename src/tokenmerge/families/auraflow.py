"""AuraFlow (fal/AuraFlow v0.1-v0.3): MMDiT blocks, then single-stream blocks, over [registers + text; image].

``AuraFlowJointTransformerBlock``s as SD3's (:func:`.base.joint_block`): the image stream meets the text in ``attn``,
whose processor concatenates [text; image] and returns ``(image, text)``; the image stream is merged around ``attn``
and around its MLP ``ff``, and its key and value projections (``to_k`` / ``to_v``, followed by a per-token qk-norm
only) run on downsampled tokens. ``AuraFlowSingleTransformerBlock``s get [text; image] concatenated by the root
and run ``attn`` then ``ff`` one after the other on the joint sequence (each added to the block's input): each is
a merged span of its own.

Token layout, read at the root:

- grid: ``hidden_states`` (B, C, H, W) over ``patch_size``.
- text: the model's 8 learned register tokens, then ``encoder_hidden_states`` (UMT5 tokens, multiplied by their mask
  by the pipeline, which passes no mask): first in every attention, never reduced.
- positions: learned, added at the patch embedding (before any merge); no rotary table.

Keys and values (todo/auto) are reduced at their projections in the joint blocks and at SDPA in the single blocks.
"""

from __future__ import annotations

import torch

from ..algorithms import TokenGrid, TokenLayout
from . import Family
from .base import Argument, BlockLayout, Container, DenoiserLayout, KeyValueSite, Span, joint_block, text_length


class AuraFlowGrid:
    """[registers + text; image]: the (B, C, H, W) latent over ``patch_size``, and ``encoder_hidden_states`` with the
    register tokens the root puts in front of it."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.tokens, self.text = Argument(root, "hidden_states"), Argument(root, "encoder_hidden_states")
        self.p, self.registers = root.config.patch_size, root.register_tokens.shape[1]

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        x = self.tokens(args, kwargs)
        if not isinstance(x, torch.Tensor) or x.ndim != 4:
            return None
        grid = TokenGrid((x.shape[-2] // self.p, x.shape[-1] // self.p), patch=(self.p, self.p))
        return TokenLayout.joint(("text", "image"), grid, self.registers + text_length(self.text(args, kwargs)))


def single_block(module: torch.nn.Module) -> BlockLayout:
    attn, ff = module.attn, module.ff
    spans = [Span("merge_attn", attn, attn, stream="joint", name="attn"), Span("merge_mlp", ff, ff, stream="joint", name="ff")]
    return BlockLayout(module, spans, [KeyValueSite(attn, stream="joint")], input_stream="joint", kind=type(module).__name__)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [joint_block(b, projections=True) for b in getattr(module, "joint_transformer_blocks", [])]
    blocks += [single_block(b) for b in getattr(module, "single_transformer_blocks", [])]
    return DenoiserLayout(module, [Container(module, blocks, 1, AuraFlowGrid(module))], "auraflow", single_level=True) if blocks else None


FAMILY = Family(
    name="auraflow",
    title="AuraFlow",
    timesteps=(1.0, 0.0),  # the pipeline passes timestep / 1000
    classes=("AuraFlowTransformer2DModel",),
    layout=layout,
    pipelines=("AuraFlowPipeline",),
    notes="grid: hidden_states (B, C, H, W) / patch_size; text: 8 register tokens + encoder_hidden_states, first in every "
    "attention; single-stream blocks get [text; image] concatenated; positions: learned, added at the patch embedding",
)
