"""FramePack (HunyuanVideo-based image-to-video, section by section): HunyuanVideo's blocks over the section's
latents packed after its clean history.

The blocks are :mod:`.hunyuanvideo`'s (dual-stream ``HunyuanVideoTransformerBlock``, single-stream
``HunyuanVideoSingleTransformerBlock``), laid out as there. Before them the model packs the video stream as [4x
history; 2x history; clean latents (the start image and the 1x history); the section's latents], each history
patched by its own (coarser) embedder: the history and the clean latents are reference segments, never reduced; the
section's latents are the target.

Token layout, read at the root:

- grid: ``hidden_states`` (B, C, F, H, W) over (``patch_size_t``, ``patch_size``, ``patch_size``), frame-major, last
  in the video stream; the references' token counts from ``latents_history_4x`` (patches (4, 8, 8), padded),
  ``latents_history_2x`` ((2, 4, 4), padded) and ``latents_clean`` ((1, 2, 2)).
- text: [SigLIP ``image_embeds``; refined ``encoder_hidden_states``], after the video. At batch 1 the model drops the
  text's padding itself: its length is then read from ``encoder_attention_mask`` (one host read per mask tensor).
- rotary: ``image_rotary_emb = (cos, sin)``, each (N_video, D) over the whole video stream, no batch dimension:
  gathered at each sample's kept rows; the (B, 1, 1, N) attention mask (batch > 1) follows too.

Keys and values (todo/auto) are reduced at the dispatch call, after the rotary embedding, the mask's key columns
with them.
"""

from __future__ import annotations

import math

import torch

from ..algorithms import TokenGrid, TokenLayout
from . import Family
from .base import Argument, Container, DenoiserLayout, HostReads, joint_block, single_stream_block, text_length
from .hunyuanvideo import MASK, ROTARY

# (history latents argument, its patch (frames, height, width)), in the order the model packs them
HISTORY = (("latents_history_4x", (4, 8, 8)), ("latents_history_2x", (2, 4, 4)), ("latents_clean", (1, 2, 2)))


def _valid(mask: torch.Tensor) -> int:
    return int(mask[0].sum())


class FramepackLayout:
    """[4x history; 2x history; clean latents; section; image tokens + text] of a FramePack call."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.tokens, self.history = Argument(root, "hidden_states"), [(Argument(root, name), patch) for name, patch in HISTORY]
        self.text, self.mask, self.image = (Argument(root, n) for n in ("encoder_hidden_states", "encoder_attention_mask", "image_embeds"))
        self.patch = (root.config.patch_size_t, root.config.patch_size, root.config.patch_size)
        self.reads = HostReads()

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        x, mask = self.tokens(args, kwargs), self.mask(args, kwargs)
        if not isinstance(x, torch.Tensor) or x.ndim != 5:
            return None
        references = []
        for read, patch in self.history:
            latents = read(args, kwargs)
            if isinstance(latents, torch.Tensor) and latents.ndim == 5:
                references.append(math.prod(math.ceil(s / p) for s, p in zip(latents.shape[2:], patch)))
        text = text_length(self.text(args, kwargs))
        if x.shape[0] == 1 and isinstance(mask, torch.Tensor):  # the model drops the text's padding at batch 1
            text = self.reads(mask, _valid)
        grid = TokenGrid(tuple(s // p for s, p in zip(x.shape[2:], self.patch)), patch=self.patch)
        return TokenLayout.joint(("reference", "image", "text"), grid, text_length(self.image(args, kwargs)) + text, tuple(references))


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [joint_block(b, follows=(ROTARY, MASK)) for b in getattr(module, "transformer_blocks", [])]
    blocks += [single_stream_block(b, follows=(ROTARY, MASK)) for b in getattr(module, "single_transformer_blocks", [])]
    if not blocks:
        return None
    return DenoiserLayout(module, [Container(module, blocks, 1, FramepackLayout(module))], "framepack", single_level=True)


FAMILY = Family(
    px=(16, 4),
    name="framepack",
    title="FramePack (HunyuanVideo)",
    classes=("HunyuanVideoFramepackTransformer3DModel",),
    layout=layout,
    pipelines=("HunyuanVideoFramepackPipeline",),
    notes="grid: hidden_states (B, C, F, H, W) / (patch_size_t, patch_size, patch_size), after the 4x and 2x histories "
    "and the clean latents (references, never reduced); text: [image_embeds; encoder_hidden_states] after the video, its "
    "length at batch 1 from encoder_attention_mask (one host read per mask); rotary: image_rotary_emb (cos, sin) over the "
    "video stream, gathered at each sample's kept rows; the joint attention mask follows",
)
