"""EasyAnimate (V5.1; text-, image- and control-to-video): joint-attention video DiT blocks over [text; video].

``EasyAnimateTransformerBlock``: one joint attention (``attn1``) takes the video tokens and the text separately; its
processor puts [text; video] together (MMDiT blocks: each stream's own projections; the others: the sequence
concatenated before shared ones), applies the 3-D rotary table to the video rows of the queries and keys, calls torch's
SDPA and returns ``(video, text)``. The MLP runs on each stream apart: ``ff`` on the video and ``txt_ff`` on the text in
MMDiT blocks, ``ff`` on both (the video first) in the others, so the video is merged from its ``norm2`` output (element
0; the text's is element 1) to ``ff``'s output, which the video call leaves first; and around ``attn1``.

Token layout, read at the root:

- grid: ``hidden_states`` (B, C, F, H, W) over (1, ``patch_size``, ``patch_size``), frame-major. Inpainting and
  control latents are concatenated by channels (every token is generated).
- text: ``encoder_hidden_states`` (Qwen2-VL tokens, padded to 256; no mask reaches the model), then
  ``encoder_hidden_states_t5`` where given: first in every attention, never reduced.
- rotary: ``(cos, sin)``, each (N_video, D), computed by the root and handed to every block as ``image_rotary_emb``:
  video rows only, no batch dimension; gathered at each sample's kept rows.

Keys and values (todo/auto) are reduced at SDPA, after the rotary embedding.
"""

from __future__ import annotations

import torch

from ..algorithms import TokenGrid, TokenLayout
from . import Family
from .base import Argument, BlockLayout, Container, DenoiserLayout, Follow, KeyValueSite, Span, text_length

ROTARY = Follow("image_rotary_emb", dim=0, stream="image")


class EasyAnimateGrid:
    """[text; video] from ``hidden_states`` (B, C, F, H, W), ``encoder_hidden_states`` and ``encoder_hidden_states_t5``."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.tokens = Argument(root, "hidden_states")
        self.texts = (Argument(root, "encoder_hidden_states"), Argument(root, "encoder_hidden_states_t5"))
        self.p = root.config.patch_size

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        x = self.tokens(args, kwargs)
        if not isinstance(x, torch.Tensor) or x.ndim != 5:
            return None
        grid = TokenGrid((x.shape[2], x.shape[3] // self.p, x.shape[4] // self.p), patch=(1, self.p, self.p))
        return TokenLayout.joint(("text", "image"), grid, sum(text_length(read(args, kwargs)) for read in self.texts))


def block(module: torch.nn.Module) -> BlockLayout:
    attn, norm, ff = module.attn1, module.norm2, module.ff
    spans = [
        Span("merge_attn", attn, attn, leave_index=0, follows=((attn, ROTARY),), name="attn1"),
        Span("merge_mlp", norm, ff, enter_on_output=True, enter_index=0, name="norm2+ff"),
    ]
    return BlockLayout(module, spans, [KeyValueSite(attn, stream="joint")], kind=type(module).__name__)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [block(b) for b in getattr(module, "transformer_blocks", [])]
    if not blocks:
        return None
    return DenoiserLayout(module, [Container(module, blocks, 1, EasyAnimateGrid(module))], "easyanimate", single_level=True)


# 49 frames (4x temporal VAE: 13 latent frames) at 512x512 px: the pipeline's default.
FAMILY = Family(
    px=(16, 4),
    name="easyanimate",
    title="EasyAnimate",
    classes=("EasyAnimateTransformer3DModel",),
    layout=layout,
    pipelines=("EasyAnimatePipeline", "EasyAnimateInpaintPipeline", "EasyAnimateControlPipeline"),
    notes="grid: hidden_states (B, C, F, H, W) / (1, patch_size, patch_size), frame-major; text: encoder_hidden_states "
    "(+ encoder_hidden_states_t5), first in every attention; rotary: computed by the root, video rows, gathered at each "
    "sample's kept rows",
)
