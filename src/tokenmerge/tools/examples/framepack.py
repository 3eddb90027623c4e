"""The examples of the framepack family (tokenmerge.families.framepack): its published config, tiny config and its pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import Example
from .hunyuanvideo import CONFIG as HUNYUANVIDEO
from .hunyuanvideo import SMALL as HUNYUANVIDEO_SMALL
from .hunyuanvideo import first_blocks

# The pipeline's history sizes in latent frames (inverted anti-drifting sampling): the 1x history (with the start
# image's latent before it: the clean latents), the 2x and the 4x history.
HISTORY = (1, 2, 16)
IMAGE_TOKENS = 729  # SigLIP's image tokens (27 x 27)


def inputs(model: torch.nn.Module, height: int, width: int, batch: int, seed: int, text_tokens: int, frames: int = 3) -> dict[str, Any]:
    """The FramePack pipeline's call for one section of ``frames`` latent frames at (height, width): Llama text whose
    last quarter is padding (the model drops it itself at batch 1), CLIP's pooled prompt, SigLIP image tokens, the
    clean latents and the 2x and 4x histories with their frame indices, the distilled guidance (10.0, x1000)."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    one, two, four = HISTORY
    indices = torch.arange(1 + frames + one + two + four)
    prefix, latents, clean, history_2x, history_4x = indices.split([1, frames, one, two, four])
    mask = torch.zeros(batch, text_tokens, dtype=torch.long)
    mask[:, : max(1, text_tokens - text_tokens // 4)] = 1

    def latent(count: int) -> torch.Tensor:
        return torch.randn(batch, config.in_channels, count, height, width, generator=g).to(dtype)

    return {
        "hidden_states": latent(frames),
        "timestep": torch.full((batch,), 500.0),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.text_embed_dim, generator=g).to(dtype),
        "encoder_attention_mask": mask,
        "pooled_projections": torch.randn(batch, config.pooled_projection_dim, generator=g).to(dtype),
        "image_embeds": torch.randn(batch, IMAGE_TOKENS, config.image_proj_dim, generator=g).to(dtype),
        "indices_latents": latents,
        "guidance": torch.full((batch,), 10000.0).to(dtype),
        "latents_clean": latent(1 + one),
        "indices_latents_clean": torch.cat([prefix, clean]),
        "latents_history_2x": latent(two),
        "indices_latents_history_2x": history_2x,
        "latents_history_4x": latent(four),
        "indices_latents_history_4x": history_4x,
        "return_dict": False,
    }


# config.json of lllyasviel/FramePackI2V_HY (from memory of the published repo): HunyuanVideo's, with the clean
# latents' embedders and SigLIP's image projection.
CONFIG = {**HUNYUANVIDEO, "has_clean_x_embedder": True, "has_image_proj": True, "image_proj_dim": 1152}


SMALL = {**HUNYUANVIDEO_SMALL, "image_proj_dim": 8}


TEXT_TOKENS = 256  # the pipeline's max_sequence_length


FAMILY = "framepack"
# One section: latent_window_size 9 at 640x640 px (the pipeline's defaults).
EXAMPLES = {"framepack": Example("HunyuanVideoFramepackTransformer3DModel", CONFIG, SMALL, inputs, TEXT_TOKENS, first_blocks, frames=9)}
