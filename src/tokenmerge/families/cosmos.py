"""Cosmos (1.0 Diffusion, Predict2, Predict2.5: text-to-world, video-to-world, text-to-image): video DiTs of
self+cross blocks.

``CosmosTransformerBlock``: self-attention (``attn1``, with the 3-D rotary ``(cos, sin)``), cross-attention
(``attn2``) to the T5 text (and, in Predict2.5's image-context models, to image tokens, in the same module) and MLP
(``ff``), on the video tokens alone, each merged around itself, after the block's AdaLN-LoRA modulation (per token
where the timestep is per frame) and before its gate. The learnable positions (``extra_pos_emb``) and ControlNet
residuals are added per token outside the spans.

Token layout, read at the root:

- grid: ``hidden_states`` (B, C, F, H, W) over ``patch_size`` (1, 2, 2): a (frames, h, w) grid, frame-major.
- condition frames: video-to-world passes ``condition_mask`` (B, 1, F, H, W), 1 on the leading latent frames that
  hold the clean input video: those frames are a reference segment, never reduced, read by one host read per mask
  tensor (the pipelines pass the same one at every step; where the conditional and unconditional calls pass masks of
  their own, one read per call).
- text: cross-attention only (``attn2``), never reduced.
- rotary: ``image_rotary_emb = (cos, sin)``, each (N, D), computed by the model: no batch dimension; gathered at
  each sample's kept rows.

Keys and values (todo/auto) are reduced at ``dispatch_attention_fn`` in ``attn1``, after the rotary embedding.
Timesteps are read on the Predict2 / 2.5 scale (t = sigma / (sigma + 1), 1 at pure noise); Cosmos 1.0's EDM
pipelines pass log(sigma) / 4 instead, which auto's noise gate then reads as noisier at high noise and cleaner at
low noise than it is.
"""

from __future__ import annotations

import torch

from ..algorithms import TokenGrid, TokenLayout
from . import Family
from .base import Argument, Container, DenoiserLayout, Follow, HostReads, self_cross_block

ROTARY = Follow("image_rotary_emb", dim=0, stream="image")


def _leading_frames(mask: torch.Tensor) -> int:
    """How many leading frames of a (B, 1, F, H, W) condition mask are set (the first sample's: the pipelines give
    every sample the same)."""
    flags = (mask[0].amax(dim=(0, 2, 3)) > 0).tolist()
    return next((i for i, flag in enumerate(flags) if not flag), len(flags))


class CosmosGrid:
    """The (frames, h, w) video grid, its leading condition frames (``condition_mask``) a reference segment."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.tokens, self.condition = Argument(root, "hidden_states"), Argument(root, "condition_mask")
        self.patch = tuple(root.config.patch_size)
        self.reads = HostReads()

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        x, mask = self.tokens(args, kwargs), self.condition(args, kwargs)
        if not isinstance(x, torch.Tensor) or x.ndim != 5:
            return None
        pt, ph, pw = self.patch
        frames, h, w = x.shape[2] // pt, x.shape[3] // ph, x.shape[4] // pw
        clean = self.reads(mask, _leading_frames) // pt if isinstance(mask, torch.Tensor) and mask.ndim == 5 else 0
        if 0 < clean < frames:
            reference = TokenGrid((clean, h, w), patch=self.patch)
            return TokenLayout.joint(("reference", "image"), TokenGrid((frames - clean, h, w), patch=self.patch), 0, (reference,))
        return TokenLayout.image_only(TokenGrid((frames, h, w), patch=self.patch))


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [
        self_cross_block(b, names=("attn1", "attn2", "ff"), follows=(ROTARY,))
        for b in getattr(module, "transformer_blocks", [])
        if isinstance(getattr(b, "attn1", None), torch.nn.Module)
    ]
    return DenoiserLayout(module, [Container(module, blocks, 1, CosmosGrid(module))], "cosmos", single_level=True) if blocks else None


FAMILY = Family(
    px=(16, 4),  # Predict2's Wan VAE (1.0's tokenizer compresses 8 frames per latent frame)
    name="cosmos",
    title="Cosmos",
    classes=("CosmosTransformer3DModel",),
    layout=layout,
    pipelines=(
        "Cosmos2VideoToWorldPipeline",
        "Cosmos2TextToImagePipeline",
        "CosmosTextToWorldPipeline",
        "CosmosVideoToWorldPipeline",
        "Cosmos2_5_PredictBasePipeline",
    ),
    cross_attention=True,
    timesteps=(1.0, 0.0),  # Predict2 / 2.5 pass sigma / (sigma + 1)
    notes="grid: hidden_states (B, C, F, H, W) / patch_size (1, 2, 2), frame-major; video-to-world: the leading frames "
    "set in condition_mask are a reference (one host read per mask tensor); text: cross-attention (attn2) only; rotary: "
    "image_rotary_emb (cos, sin), each (N, D), gathered at each sample's kept rows",
)
