"""HunyuanVideo (text-to-video; image-to-video with token replacement or latent concatenation).

Two block patterns, as in Flux: ``HunyuanVideoTransformerBlock`` (dual-stream: the video stream and the text stream
meet in one joint attention, [video; text], the video merged around ``attn`` and ``ff``) and
``HunyuanVideoSingleTransformerBlock`` (the block appends the text itself; attention and MLP in parallel on the
normalised [video; text] sequence, merged from ``norm``'s output to ``proj_out``'s). The I2V model's
``TokenReplace`` blocks are the same patterns.

Token layout, read at the root:

- grid: ``hidden_states`` (B, C, F, H, W) over (``patch_size_t``, ``patch_size``, ``patch_size``), frame-major. With
  ``image_condition_type="token_replace"`` (HunyuanVideo-I2V) the first latent frame is the clean image, whose
  tokens the blocks modulate apart: a reference segment, never reduced.
- text: ``encoder_hidden_states`` (after the token refiner, same length), after the video.
- rotary: ``image_rotary_emb = (cos, sin)``, each (N_video, D), no batch dimension: gathered at each sample's kept
  rows. The attention mask the model builds over [video; text] (B, 1, 1, N) follows the merge too.

Keys and values (todo/auto) are reduced at the dispatch call, after the rotary embedding, the mask's key columns
with them (nearest interpolations).
"""

from __future__ import annotations

import torch

from . import Family
from .base import Argument, ComfyBlocks, ComfyModel, Container, DenoiserLayout, Follow, VideoGrid, joint_block, single_stream_block

ROTARY = Follow("image_rotary_emb", dim=0, stream="image")
MASK = Follow("attention_mask", dim=-1, stream="joint")


class TokenReplace:
    """HunyuanVideo-I2V (token replacement): the first latent frame is the condition image, in every call."""

    def __call__(self, args: tuple, kwargs: dict) -> bool:
        return True


def layout(module: torch.nn.Module) -> DenoiserLayout | None:
    blocks = [joint_block(b, follows=(ROTARY, MASK)) for b in getattr(module, "transformer_blocks", [])]
    blocks += [single_stream_block(b, follows=(ROTARY, MASK)) for b in getattr(module, "single_transformer_blocks", [])]
    if not blocks:
        return None
    config = module.config
    replace = TokenReplace() if getattr(config, "image_condition_type", None) == "token_replace" else None
    patch = (config.patch_size_t, config.patch_size, config.patch_size)
    reader = VideoGrid(patch, Argument(module, "hidden_states"), replace, Argument(module, "encoder_hidden_states"))
    return DenoiserLayout(module, [Container(module, blocks, 1, reader)], "hunyuanvideo", single_level=True)


# ComfyUI's HunyuanVideo class, which HunyuanVideo 1.5 shares (families/hunyuanvideo15.py claims the instances with
# a vision projection)
COMFY = ComfyModel(
    ("HunyuanVideo",),
    "HunyuanVideo",
    patch=(1, 2, 2),
    image="last",
    first_if="double_blocks.0.flipped_img_txt",
    # 0.33's block patches: the video alone in the double blocks, [text; video] in the single ones; rotary rows
    # [text; video] along axis 2 (0.3.64's flipped order offers none: auto instead)
    blocks=ComfyBlocks((("double_block", "double_blocks"), ("single_block", "single_blocks")), joint=("single_block",), pe_dims=(2,)),
    declines=("ref_latent",),
    notes="comfy/ldm/hunyuan_video: q, k, v (B, H, S, D) after the rotary embedding; [text; video] in 0.33 (the text "
    "of any make-up: LLM, byT5, SigLIP tokens, before the video), [video; text] in 0.3.64 (Flux's blocks flipped, "
    "flipped_img_txt); the text refiner's attention (text only) left alone",
)


FAMILY = Family(
    px=(16, 4),
    name="hunyuanvideo",
    title="HunyuanVideo",
    classes=("HunyuanVideoTransformer3DModel",),
    layout=layout,
    pipelines=("HunyuanVideoPipeline", "HunyuanVideoImageToVideoPipeline"),
    # 129 frames (33 latent) at 720x1280 px: the pipeline's default.
    notes="grid: hidden_states (B, C, F, H, W) / (patch_size_t, patch_size, patch_size), frame-major; token_replace I2V: "
    "the first latent frame is a reference; text: encoder_hidden_states, after the video; rotary: image_rotary_emb "
    "(cos, sin), video rows, gathered at each sample's kept rows; the joint attention mask follows",
    comfy=COMFY,
)
