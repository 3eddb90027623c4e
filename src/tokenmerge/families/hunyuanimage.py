"""HunyuanImage 2.1 (and its refiner): HunyuanVideo's block patterns on one image.

Two block patterns, as in HunyuanVideo: ``HunyuanImageTransformerBlock`` (dual-stream: the image stream and the text
stream meet in one joint attention, [image; text], the image merged around ``attn`` and ``ff``) and
``HunyuanImageSingleTransformerBlock`` (the block appends the text itself; attention and MLP in parallel on the
normalised [image; text] sequence, merged from ``norm``'s output to ``proj_out``'s). The token refiner that embeds
the text attends over the text alone: left as it is.

Token layout, read at the root:

- grid: ``hidden_states`` (B, C, H, W) over ``patch_size`` (1x1 patches of the 32x VAE's latent); the refiner's
  (B, C, 1, H, W), its single frame dropped.
- text: ``encoder_hidden_states`` (Qwen2.5-VL, after the token refiner: same length), and where the model has a
  glyph projection (``text_embed_2_dim``) ``encoder_hidden_states_2`` (ByT5) too: the model reorders both into one
  sequence after the image, so the text's length is the sum of theirs.
- rotary: ``image_rotary_emb = (cos, sin)``, each (N, D), image rows only, no batch dimension: gathered at each
  sample's kept rows. The attention mask the model builds over [image; text] (B, 1, 1, N + T) follows the merge too.

Keys and values (todo/auto) are reduced at the dispatch call, after the rotary embedding, the mask's key columns with
them (nearest interpolations).
"""

from __future__ import annotations

import torch

from ..algorithms import TokenGrid, TokenLayout
from . import Family
from .base import Argument, Container, DenoiserLayout, Follow, joint_block, single_stream_block, text_length

FOLLOWS = (Follow("image_rotary_emb", dim=0, stream="image"), Follow("attention_mask", dim=-1, stream="joint"))


class ImageAndTexts:
    """[image; text]: the grid of ``hidden_states`` over the model's ``patch_size``, the text's length that of the
    sequences the model concatenates after it (the glyph text only where the model projects it)."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.tokens = Argument(root, "hidden_states")
        names = ("encoder_hidden_states", "encoder_hidden_states_2") if root.context_embedder_2 is not None else ("encoder_hidden_states",)
        self.texts = [Argument(root, name) for name in names]
        self.patch = tuple(root.config.patch_size)

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        x = self.tokens(args, kwargs)
        if not isinstance(x, torch.Tensor) or x.ndim != 2 + len(self.patch):
            return None
        shape, patch = tuple(s // p for s, p in zip(x.shape[2:], self.patch)), self.patch
        if len(shape) == 3:  # the refiner's (1, h, w): one frame, row-major as an image's
            if shape[0] != 1:
                return None
            shape, patch = shape[1:], patch[1:]
        text = sum(text_length(read(args, kwargs)) for read in self.texts)
        return TokenLayout.joint(("image", "text"), TokenGrid(shape, patch=patch), text)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [joint_block(b, follows=FOLLOWS) for b in getattr(module, "transformer_blocks", [])]
    blocks += [single_stream_block(b, follows=FOLLOWS) for b in getattr(module, "single_transformer_blocks", [])]
    if not blocks:
        return None
    return DenoiserLayout(module, [Container(module, blocks, 1, ImageAndTexts(module))], "hunyuanimage", single_level=True)


FAMILY = Family(
    px=(32, 0),  # its 32x VAE, 1x1 patches
    name="hunyuanimage",
    title="HunyuanImage 2.1",
    classes=("HunyuanImageTransformer2DModel",),
    layout=layout,
    pipelines=("HunyuanImagePipeline", "HunyuanImageRefinerPipeline"),
    notes="grid: hidden_states (B, C, H, W) / patch_size (the refiner's (B, C, 1, H, W): its one frame); text: "
    "encoder_hidden_states plus, with a glyph projection, encoder_hidden_states_2, after the image; rotary: "
    "image_rotary_emb (cos, sin), image rows, gathered at each sample's kept rows; the joint attention mask follows",
)
