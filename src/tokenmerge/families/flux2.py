"""Flux.2 (dev, klein): ``Flux2TransformerBlock``s (dual stream, [text; image] in the joint attention), then
``Flux2SingleTransformerBlock``s that get [text; image] already concatenated (``encoder_hidden_states=None``) and
run a parallel self-attention whose MLP is fused into the attention module.

Reference images (multi-reference edits) are appended after the target in ``hidden_states`` and ``img_ids``, with
their own t coordinate (10, 20, ...): they are segments of their own, never reduced. Grid from ``img_ids`` (t, row,
col, l); text length from ``encoder_hidden_states`` at the root. Rotary: one (cos, sin) table shared by the batch,
rows [text; image; references], applied inside the processors (keys and values are downsampled after it, so kept
keys keep their exact positions; a merged token takes its destination's rows, each sample its own). The Klein-KV pipeline's cached calls
(``kv_cache_mode``) carry reference keys and values outside the sequence: they run unchanged.
"""

from __future__ import annotations

import torch

from ..algorithms import TokenLayout
from ..notices import warn_at_caller
from . import Family
from .base import DECLINED, Argument, ComfyModel, Container, DenoiserLayout, Follow, IdsLayout, fused_parallel_block, joint_block
from .flux import COMFY_BLOCKS

ROTARY = Follow("image_rotary_emb", dim=0, stream="joint")


class Flux2Layout(IdsLayout):
    """Flux.1's ids reader, except calls with a key/value cache (Klein-KV), whose sequences are not the ids'."""

    def __init__(self, root: torch.nn.Module) -> None:
        super().__init__(root, ("text", "image", "reference"))
        self.cache_mode = Argument(root, "kv_cache_mode")

    def __call__(self, args: tuple, kwargs: dict) -> TokenLayout | None:
        if self.cache_mode(args, kwargs) is not None:
            if not self.warned:
                self.warned = True
                warn_at_caller("tokenmerge: Flux.2 calls with a key/value cache (kv_cache_mode) run unchanged")
            return DECLINED
        return super().__call__(args, kwargs)


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [joint_block(b, follows=(ROTARY,)) for b in getattr(module, "transformer_blocks", [])]
    blocks += [fused_parallel_block(b, follows=(ROTARY,)) for b in getattr(module, "single_transformer_blocks", [])]
    return DenoiserLayout(module, [Container(module, blocks, 1, Flux2Layout(module))], "flux2", single_level=True) if blocks else None


FAMILY = Family(
    name="flux2",
    title="Flux.2",
    timesteps=(1.0, 0.0),  # the pipeline passes timestep / 1000
    classes=("Flux2Transformer2DModel",),
    layout=layout,
    pipelines=("Flux2Pipeline", "Flux2KleinPipeline"),
    notes="grid and references: img_ids (t, row, col, l), references after the target (t = 10, 20, ...), one host read "
    "per ids tensor; text: encoder_hidden_states at the root, first; single-stream blocks get [text; image] concatenated; "
    "rotary: image_rotary_emb (cos, sin) rows [text; image; references]",
    comfy=ComfyModel(
        ("Flux",),
        "Flux.2",
        patch=(1, 1),
        image_models=("flux2",),
        blocks=COMFY_BLOCKS,
        notes="comfy/ldm/flux (ComfyUI >= 0.4, image_model flux2): 1x1 patches of a 128-channel latent; q, k, v (B, H, S, D) "
        "after the rotary embedding, [text; image; reference latents]",
    ),
)
