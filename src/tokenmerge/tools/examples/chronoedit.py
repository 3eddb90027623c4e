"""The examples of the chronoedit family (tokenmerge.families.chronoedit): its published config, tiny config and its pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from functools import partial

from . import Example
from .wan import I2V, SMALL_I2V, TEXT_TOKENS, first_blocks, inputs

# transformer/config.json of nvidia/ChronoEdit-14B-Diffusers: Wan 2.1 I2V 14B's (CLIP image tokens, the image latent
# and mask as 20 more channels) with the temporal skip of its rotary table.
CONFIG = {**I2V, "rope_temporal_skip_len": 8}


# 5 frames (2 latent frames: the input image and the edit) at 480x832 px: the pipeline's default, without temporal
# reasoning; Wan's call (the same arguments) at 2 frames, where the skip applies.
FRAMES = 2


FAMILY = "chronoedit"
EXAMPLES = {
    "chronoedit": Example(
        "ChronoEditTransformer3DModel", CONFIG, SMALL_I2V, partial(inputs, frames=FRAMES), TEXT_TOKENS, first_blocks, frames=FRAMES
    ),
}
