"""HunyuanVideo 1.5 (text-to-video and image-to-video, 480p / 720p): dual-stream video DiT blocks.

``HunyuanVideo15TransformerBlock``: the video stream (``norm1``, ``ff``) and the context stream (``norm1_context``,
``ff_context``) meet in one joint attention (``attn``) whose processor applies the 3-D rotary table to the video
queries and keys, appends the context after the video ([video; context]) and calls ``dispatch_attention_fn`` with a
mask it builds from the context's mask, padded in front to the current length (so it follows a merge of the video).
Merged: the video stream around ``attn`` (its output element 0) and ``ff``.

Token layout, read at the root:

- grid: ``hidden_states`` (B, C, F, H, W) over (``patch_size_t``, ``patch_size``, ``patch_size``), frame-major.
  Image-to-video conditions by channels (the image latent and a mask) and by SigLIP tokens in the context: every
  video token is generated.
- context (never reduced): the Qwen2.5-VL text (``encoder_hidden_states``), the ByT5 glyph text
  (``encoder_hidden_states_2``) and the 729 image tokens (``image_embeds``, zeros for text-to-video), which the
  model reorders into one sequence after the video: its length is the sum of theirs.
- rotary: ``image_rotary_emb = (cos, sin)``, each (N_video, D): video rows only, no batch dimension; gathered at
  each sample's kept rows.

Keys and values (todo/auto) are reduced at the dispatch call, after the rotary embedding; the mask's key columns
follow (nearest interpolations; others leave masked calls unchanged, with a warning).
"""

from __future__ import annotations

import dataclasses

import torch

from ..algorithms import TokenGrid, TokenLayout
from . import Family
from .base import Argument, Container, DenoiserLayout, Follow, joint_block, text_length
from .hunyuanvideo import COMFY as HUNYUANVIDEO_COMFY

ROTARY = Follow("image_rotary_emb", dim=0, stream="image")


class VideoAndContext:
    """[video; context]: the grid of ``hidden_states`` (B, C, F, H, W), the context's length summed over the
    ``contexts`` sequences the model concatenates (HunyuanVideo 1.5's three; Motif-Video's vision tokens and text)."""

    def __init__(
        self, root: torch.nn.Module, contexts: tuple[str, ...] = ("encoder_hidden_states", "encoder_hidden_states_2", "image_embeds")
    ) -> None:
        self.tokens = Argument(root, "hidden_states")
        self.contexts = [Argument(root, name) for name in contexts]
        self.patch = (root.config.patch_size_t, root.config.patch_size, root.config.patch_size)

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        x = self.tokens(args, kwargs)
        if not isinstance(x, torch.Tensor) or x.ndim != 5:
            return None
        pt, p, _ = self.patch
        grid = TokenGrid((x.shape[2] // pt, x.shape[3] // p, x.shape[4] // p), patch=self.patch)
        context = sum(text_length(read(args, kwargs)) for read in self.contexts)
        return TokenLayout.joint(("image", "text"), grid, context)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [
        joint_block(b, follows=(ROTARY,))
        for b in getattr(module, "transformer_blocks", [])
        if isinstance(getattr(b, "attn", None), torch.nn.Module)
    ]
    if not blocks:
        return None
    return DenoiserLayout(module, [Container(module, blocks, 1, VideoAndContext(module))], "hunyuanvideo15", single_level=True)


FAMILY = Family(
    px=(16, 4),
    name="hunyuanvideo15",
    title="HunyuanVideo 1.5",
    classes=("HunyuanVideo15Transformer3DModel",),
    layout=layout,
    pipelines=("HunyuanVideo15Pipeline", "HunyuanVideo15ImageToVideoPipeline"),
    # 121 frames (4x temporal VAE: 31 latent frames) at 480p (16x VAE: 30x53 tokens a frame, 848x480 px).
    notes="grid: hidden_states (B, C, F, H, W) / (patch_size_t, patch_size, patch_size), frame-major; context "
    "(text, glyph text, image tokens; never reduced): after the video in the joint attention, its length the sum of "
    "encoder_hidden_states, encoder_hidden_states_2 and image_embeds; rotary: image_rotary_emb (cos, sin), video rows "
    "only, gathered at each sample's kept rows",
    # ComfyUI runs it in HunyuanVideo's class (its instances with a SigLIP projection, vision_in): the same layout,
    # the text before the video made of SigLIP, byT5 and LLM tokens
    comfy=dataclasses.replace(HUNYUANVIDEO_COMFY, title="HunyuanVideo 1.5", present="vision_in"),
)
