"""The examples tests and benchmarks build, one module per model family (the family's name, without hyphens): the
published model's config, a tiny config of the same structure, the inputs its pipeline passes and the config of its
first blocks, and ComfyUI's tiny configs of the same families (:mod:`tokenmerge.tools.comfy_dits`). Family modules
(:mod:`tokenmerge.families`) hold only what patching needs; nothing in the core imports this package.

Each module (named as its family's module in :mod:`tokenmerge.families`, so the two registries list the families in
one order) defines ``FAMILY`` (its family's registry name) and ``EXAMPLES`` (bench name -> :class:`Example`).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from ...families import Family, get


@dataclass(frozen=True)
class Example:
    """How to build one of the family's models with random weights and call it as its pipeline does.

    ``cls``: the diffusers class; ``config``: the published checkpoint's config; ``small``: overrides for a tiny
    model of the same structure; ``inputs(model, height, width, batch, seed, text_tokens)``: keyword inputs at a
    (height, width) latent (video models: also ``frames``, latent frames); ``blocks(config, n)``: the config with only
    the first ``n`` blocks; ``text_tokens``: the pipeline's default text length; ``output``: how to read the denoised
    latent from the model's output."""

    cls: str
    config: dict[str, Any]
    small: dict[str, Any]
    inputs: Callable[..., dict[str, Any]]
    text_tokens: int
    blocks: Callable[[dict[str, Any], int], dict[str, Any]] | None = None
    output: Callable[[Any], torch.Tensor] | None = None
    latent_multiple: int = 2  # latent sizes the model accepts are multiples of this
    frames: int = 0  # a video model: the latent frames of its pipeline's default video (``inputs`` takes ``frames``)
    vae_factor: int = 8  # px per latent cell (a video bench's sizes are px)
    frame_factor: int = 4  # video frames per latent frame after the VAE's causal first one


def clean_first_frame(batch: int, tokens: int, frame_tokens: int, t: float) -> torch.Tensor:
    """A per-token timestep as image-to-video pipelines pass it (what ``families.base.PerTokenTimestep`` reads): ``t`` on
    every token, 0 on the first latent frame's ``frame_tokens`` (the clean condition image)."""
    timestep = torch.full((batch, tokens), t)
    timestep[:, :frame_tokens] = 0.0
    return timestep


@dataclass(frozen=True)
class ComfyExample:
    """The family's model in ComfyUI (:mod:`tokenmerge.tools.comfy_dits`): the ``comfy.supported_models`` class and the
    ``unet_config`` its model detection writes for a checkpoint, at a tiny width; the conditioning its text encoders
    hand the sampler (``context`` / ``pooled`` widths, the caption's mask, HiDream's Llama 3 layers); the latent's
    channels and whether it is a video's; ``since``: the first ComfyUI version with the model; ``full``: the published
    width's overrides (``full_context``, ``full_pooled``) and the config keys counting ``blocks`` (and their
    proportion), where the ComfyUI bench runs it at full width; ``later_fields``: (module, parameters dataclass,
    fields) that newer ComfyUIs' model detection adds, set where that dataclass declares them; ``audio``: the audio
    latent sampled with the video (one nested latent); ``extra_conditioning``, ``clip_vision``: further conditioning the
    sampler gets (byT5 glyph text, CLIP-vision tokens); ``downscale``: pixels per latent cell (Flux.2's and Wan 2.2
    TI2V's VAEs: 16); ``family``: the family module it belongs to (set by :func:`comfy_examples`)."""

    supported: str
    unet_config: dict[str, Any]
    context: int
    pooled: int
    channels: int
    video: bool
    caption_mask: bool = False
    llama3_layers: int = 0
    since: str = "0.3.64"
    full: dict[str, Any] | None = None
    full_context: int = 0
    full_pooled: int = 0
    blocks: dict[str, int] | None = None
    later_fields: tuple[str, str, dict[str, Any]] | None = None
    audio: tuple[int, int, int] | None = None  # an audio latent (channels, frames, bins) beside the video (LTX-2)
    # more conditioning its text encoders hand over: (key, tokens, width) tensors (HunyuanVideo 1.5's byT5 glyph text),
    # and CLIP-vision tokens (tokens, width) as a clip_vision_output
    extra_conditioning: tuple[tuple[str, int, int], ...] = ()
    clip_vision: tuple[int, int] | None = None
    downscale: int = 8
    family: str = ""


@cache
def comfy_examples() -> dict[str, ComfyExample]:
    """The ComfyUI examples: each family's by its name, and a family's further models (``COMFY_MORE``: Wan 2.2 TI2V)
    by theirs."""
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if getattr(module, "COMFY", None) is not None:
            found[module.FAMILY] = dataclasses.replace(module.COMFY, family=module.FAMILY)
        for name, example in getattr(module, "COMFY_MORE", {}).items():
            found[name] = dataclasses.replace(example, family=module.FAMILY)
    return found


@cache
def examples() -> dict[str, tuple[Family, Example]]:
    """Every published model the examples describe, by bench name ("sd3", "sd35", "flux", ...), with its family."""
    found: dict[str, tuple[Family, Example]] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        family = get(module.FAMILY)
        for name, example in module.EXAMPLES.items():
            if name in found:
                raise RuntimeError(f"tokenmerge: two examples are named {name!r}")
            found[name] = (family, example)
    return found


def of_family(family: str) -> dict[str, Example]:
    """The examples of ``family`` (empty for a family without any)."""
    return {name: example for name, (found, example) in examples().items() if found.name == family}
