"""Wan 2.1 / 2.2 (T2V, I2V, FLF2V, TI2V, the 2.2 A14B pair of experts) and VACE: video DiTs of self+cross blocks.

``WanTransformerBlock``: self-attention (``attn1``, with Wan's 3-D rotary ``(cos, sin)`` passed positionally),
cross-attention (``attn2``) to the umT5 text — and, in I2V/FLF2V, to the CLIP image tokens prepended to it, which
the processor splits off by the text's fixed 512 — and an MLP (``ffn``), on the video tokens alone. Each sub-layer
is merged around itself, after the block's modulation (Wan 2.2 TI2V's per-token modulation stays per token) and
before its gate. VACE adds ``vace_blocks`` of the same structure over the control tokens (``control_hidden_states``,
padded to the video's length): matched on those.

Token layout, read at the root without a host sync:

- grid: ``hidden_states`` (B, C, F, H, W) over ``patch_size`` (1, 2, 2): a (frames, h, w) grid, frame-major. Wan 2.1
  I2V and 2.2 A14B I2V condition by channels (the image latent and a mask concatenated to C): every token is
  generated. Wan 2.2 TI2V passes a per-token ``timestep`` (B, N) and, for image-to-video, the first latent frame
  is the clean image: whenever ``timestep`` is per token, the first frame is a reference segment, never reduced
  (also in TI2V's text-to-video mode, where it could be: a host read would be needed to tell them apart).
- text: cross-attention only (``attn2``); the CLIP image tokens sit in the same context: neither is reduced.
- rotary: ``rotary_emb = (cos, sin)``, each (1, N, 1, D): no batch dimension, rows along dim 1; both gathered at
  each sample's kept rows (a merged token takes its destination's position).

Keys and values (todo/auto) are reduced at ``dispatch_attention_fn`` in ``attn1``, after the rotary embedding: a
kept key keeps its exact 3-D position. The pipelines run the two halves of classifier-free guidance as two calls.
"""

from __future__ import annotations

import torch

from . import Family
from .base import (
    Argument,
    BlockOutput,
    ComfyBlocks,
    ComfyModel,
    Container,
    DenoiserLayout,
    Follow,
    PerTokenTimestep,
    VideoGrid,
    config_int,
    self_cross_block,
)

ROTARY = Follow("rotary_emb", dim=1, stream="image")
OUTPUT = BlockOutput(per_token=("temb",))  # Wan 2.2 TI2V's per-token modulation: (B, N, 6, C)


def _blocks(module: torch.nn.Module, name: str, input_name: str, output: BlockOutput | None) -> list:
    return [
        self_cross_block(b, follows=(ROTARY,), input_name=input_name, output=output)
        for b in getattr(module, name, None) or []
        if isinstance(getattr(b, "attn1", None), torch.nn.Module)
    ]


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    # a VACE block also takes the video tokens beside its control tokens: its spans only
    blocks = _blocks(module, "vace_blocks", "control_hidden_states", None) + _blocks(module, "blocks", "hidden_states", OUTPUT)
    if not blocks:
        return None
    patch = tuple(module.config.patch_size)
    reader = VideoGrid(patch, Argument(module, "hidden_states"), PerTokenTimestep(module))
    return DenoiserLayout(module, [Container(module, blocks, 1, reader)], "wan", single_level=True)


def pixels(root: torch.nn.Module) -> tuple[int, int]:
    """(px per token side, video frames per latent frame): 2x2 patches of the Wan VAE's 8 px cells, or of Wan 2.2's
    16 px ones where the model takes its 48-channel latents (TI2V 5B); 4 frames per latent frame either way."""
    return (32 if config_int(root, "in_channels", 16) == 48 else 16), 4


FAMILY = Family(
    name="wan",
    title="Wan 2.1 / 2.2",
    px=pixels,
    classes=("WanTransformer3DModel", "WanVACETransformer3DModel"),
    layout=layout,
    pipelines=("WanPipeline", "WanImageToVideoPipeline", "WanVideoToVideoPipeline", "WanVACEPipeline"),
    cross_attention=True,
    notes="grid: hidden_states (B, C, F, H, W) / patch_size (1, 2, 2), frame-major; a per-token timestep (Wan 2.2 "
    "TI2V) makes the first latent frame a reference; text and CLIP image tokens: cross-attention (attn2) only; rotary: "
    "rotary_emb (cos, sin), each (1, N, 1, D), gathered at each sample's kept rows; VACE blocks matched on "
    "control_hidden_states",
    comfy=ComfyModel(
        ("WanModel",),
        "Wan 2.1 / 2.2",
        patch=(1, 2, 2),
        image="last",
        notes="comfy/ldm/wan: self-attention q, k, v (B, S, H*D) after the rotary embedding over the video tokens "
        "(a reference latent, if any, first); cross-attention to text and I2V's CLIP image tokens left alone",
        # "img": the video tokens, pe (B, S, 1, D/2, 2, 2) rows the stream's own
        blocks=ComfyBlocks((("double_block", "blocks"),), pe_dims=(1,)),
    ),
)
