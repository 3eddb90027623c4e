"""ConsisID (identity-preserving image-to-video): CogVideoX's joint-attention video blocks, with face conditioning.

``ConsisIDBlock`` is CogVideoX's block (:mod:`.cogvideox`, whose layout it reuses): one joint attention (``attn1``)
takes the video tokens and the text separately, concatenates [text; video], applies the 3-D rotary table to the
video rows and returns ``(video, text)``; the MLP (``ff``) then runs on the concatenated [text; video] sequence.
Merged: the video stream around ``attn1``, and the video segment of the joint sequence around ``ff``. The face
(``id_cond``, ``id_vit_hidden``) enters through the root's perceiver cross-attentions between blocks, which add to
every video token (queries of the whole, unmerged stream; keys of the face tokens): left as they are.

Token layout, read at the root:

- grid: ``hidden_states`` (B, F, C, H, W) — frames before channels, the image latent concatenated by channels (every
  token is generated) — over ``patch_size``: a (frames, h, w) grid, frame-major (no temporal patches).
- text: ``encoder_hidden_states`` (226 T5 tokens), first in the joint sequence, never reduced.
- rotary: ``image_rotary_emb = (cos, sin)``, each (N_video, D), computed by the pipeline: video rows only, no batch
  dimension; gathered at each sample's kept rows.

Keys and values (todo/auto) are reduced at SDPA, after the rotary embedding.
"""

from __future__ import annotations

import torch

from . import Family
from .base import Argument, Container, DenoiserLayout
from .cogvideox import CogVideoGrid, block


class ConsisIDGrid(CogVideoGrid):
    """CogVideoX's [text; video] reader; ConsisID's config has no ``patch_size_t`` (frames are not patched)."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.tokens, self.text = Argument(root, "hidden_states"), Argument(root, "encoder_hidden_states")
        self.p, self.pt = root.config.patch_size, 1


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [block(b) for b in getattr(module, "transformer_blocks", [])]
    return DenoiserLayout(module, [Container(module, blocks, 1, ConsisIDGrid(module))], "consisid", single_level=True) if blocks else None


# 49 frames (4x temporal VAE: 13 latent frames) at 480x720 px: the pipeline's default.
FAMILY = Family(
    px=(16, 4),
    name="consisid",
    title="ConsisID",
    classes=("ConsisIDTransformer3DModel",),
    layout=layout,
    # ConsisIDPipeline is left out: diffusers defines it only where opencv is installed (a placeholder class elsewhere);
    # its transformer is claimed by class all the same, in the pipeline or alone
    pipelines=(),
    notes="grid: hidden_states (B, F, C, H, W) / patch_size, frame-major; text: encoder_hidden_states, first in the joint "
    "sequence; rotary: image_rotary_emb (cos, sin), video rows, gathered at each sample's kept rows; the face's perceiver "
    "cross-attentions between blocks run on every token",
)
