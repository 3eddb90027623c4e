"""SkyReels-V2 (T2V, I2V and the diffusion-forcing DF models): Wan 2.1's video DiT, its blocks copied.

``SkyReelsV2TransformerBlock``: Wan's self-attention (``attn1``, with Wan's 3-D rotary ``(cos, sin)``), cross-attention
(``attn2``) to the umT5 text (and, in I2V, the CLIP image tokens before it) and MLP (``ffn``), each merged around
itself after the block's modulation and before its gate, as in :mod:`.wan`. With ``num_frame_per_block > 1`` (the DF
pipelines' ``causal_block_size``, set on the model) the self-attention is block-causal over frames (a (1, 1, N, N)
mask): a merge would join tokens across causal blocks and let earlier frames see later ones, so such calls run
unchanged.

Token layout, read at the root without a host sync:

- grid: ``hidden_states`` (B, C, F, H, W) over ``patch_size`` (1, 2, 2), frame-major; I2V conditions by channels.
  The DF pipelines pass ``enable_diffusion_forcing=True`` and a per-frame ``timestep`` (B, F), the frames of a
  prefix (the image of I2V, the overlap of a long video) at a low or zero timestep: whenever ``timestep`` is per frame,
  the first latent frame is a reference segment, never reduced (a longer prefix would need a host read to be told
  apart; its later frames are reduced as generated ones).
- text: cross-attention only (``attn2``), with I2V's CLIP image tokens: neither is reduced.
- rotary: ``rotary_emb = (cos, sin)``, each (1, N, 1, D), gathered at each sample's kept rows (Wan's).

Keys and values (todo/auto) are reduced at ``dispatch_attention_fn`` in ``attn1``, after the rotary embedding. The
blocks run span by span: the DF modulation is per token along dim 2 of ``temb`` (B, 6, N, C), which a gather of the
whole block at its entry cannot follow.
"""

from __future__ import annotations

import torch

from ..algorithms import TokenLayout
from ..notices import warn_at_caller
from . import Family
from .base import DECLINED, Argument, Container, Declined, DenoiserLayout, PerTokenTimestep, VideoGrid, self_cross_block
from .wan import ROTARY, pixels


class SkyReelsGrid(VideoGrid):
    """Wan's grid reader, except calls with block-causal self-attention: ``num_frame_per_block`` is read from the
    model's config at each call, since the DF pipelines set it (``causal_block_size``) after the model is patched."""

    def __init__(self, root: torch.nn.Module) -> None:
        super().__init__(tuple(root.config.patch_size), Argument(root, "hidden_states"), PerTokenTimestep(root))
        self.root = root
        self.warned = False

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | Declined | None:
        if self.root.config.num_frame_per_block > 1:
            if not self.warned:
                self.warned = True
                warn_at_caller(
                    "tokenmerge: SkyReels-V2 calls with block-causal attention (causal_block_size > 1) run unchanged: a merge "
                    "would join tokens of different causal blocks, letting earlier frames see later ones"
                )
            return DECLINED
        return super().__call__(args, kwargs)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "warned": False}


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [self_cross_block(b, follows=(ROTARY,)) for b in getattr(module, "blocks", None) or []]
    if not blocks:
        return None
    return DenoiserLayout(module, [Container(module, blocks, 1, SkyReelsGrid(module))], "skyreels-v2", single_level=True)


FAMILY = Family(
    name="skyreels-v2",
    title="SkyReels-V2",
    px=pixels,
    classes=("SkyReelsV2Transformer3DModel",),
    layout=layout,
    pipelines=(
        "SkyReelsV2Pipeline",
        "SkyReelsV2ImageToVideoPipeline",
        "SkyReelsV2DiffusionForcingPipeline",
        "SkyReelsV2DiffusionForcingImageToVideoPipeline",
        "SkyReelsV2DiffusionForcingVideoToVideoPipeline",
    ),
    cross_attention=True,
    notes="Wan 2.1's layout: grid: hidden_states (B, C, F, H, W) / patch_size (1, 2, 2), frame-major; a per-frame "
    "timestep (diffusion forcing) makes the first latent frame a reference; text and CLIP image tokens: cross-attention "
    "(attn2) only; rotary: rotary_emb (cos, sin), each (1, N, 1, D); block-causal calls (causal_block_size > 1) run "
    "unchanged",
)
