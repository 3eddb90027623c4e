"""The published few-step (distilled) models' sampling schedules, as their diffusers pipelines set them, for whole
few-step loops (``tokenmerge bench --schedule NAME``).

Each entry names the bench example whose architecture the model shares, the diffusers pipeline it runs in, the
published transformer's config where it differs from that example's, the scheduler config of the published checkpoint
(``scheduler/scheduler_config.json`` or its model card's recipe) and the sigmas its recipe passes where they are not
the pipeline's default. The timesteps are set as that pipeline's ``__call__`` sets them
(:func:`tokenmerge.schedules.set_timesteps`: its default sigmas and the ``mu`` of a dynamically shifted scheduler).
The loop is the flow-matching Euler step every one of these schedulers takes; the patch sits on that pipeline around
the transformer and the scheduler, so the few-step rule reads the schedule as it does in a user's pipeline. Every one
runs without classifier-free guidance (one call per step), as distilled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..schedules import set_timesteps


@dataclass(frozen=True)
class Schedule:
    """How a published few-step model samples: ``model``: the bench example of its architecture; ``pipeline``: the
    diffusers pipeline it runs in; ``overrides``: its transformer's config keys that differ from the example's;
    ``scheduler``: FlowMatchEulerDiscreteScheduler's config; ``sigmas``: the sigmas its recipe passes the pipeline
    (empty: the pipeline's default); ``size``: its default size in px (video: height, width, frames)."""

    model: str
    pipeline: str
    source: str
    steps: int
    scheduler: dict[str, Any]
    size: int | tuple[int, int, int]
    overrides: dict[str, Any] = field(default_factory=dict)
    sigmas: tuple[float, ...] = ()
    note: str = ""

    def pipeline_around(self, net: torch.nn.Module | None) -> Any:
        """Its diffusers pipeline around ``net`` and the published scheduler (timesteps not set yet), every other
        component None (no text encoder, no VAE: the loop calls the transformer itself), so that a patch on it reads
        the scheduler's steps as in a user's pipeline."""
        import inspect

        import diffusers

        cls = getattr(diffusers, self.pipeline)
        needed = [p for p, v in inspect.signature(cls.__init__).parameters.items() if v.default is inspect.Parameter.empty]
        components = {p: None for p in needed if p not in ("self", "transformer", "scheduler")}
        pipe = cls(**components, transformer=net, scheduler=diffusers.FlowMatchEulerDiscreteScheduler(**self.scheduler))
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def set_timesteps(self, pipe: Any, image_tokens: int) -> None:
        """Set ``pipe``'s scheduler as its ``__call__`` does (:func:`tokenmerge.schedules.set_timesteps`) for an image
        of ``image_tokens`` tokens (the packed latent's sequence length, which a dynamic shift reads)."""
        set_timesteps(pipe, pipe.scheduler, self.steps, image_tokens, self.sigmas or None)
        if len(pipe.scheduler.timesteps) != self.steps:
            raise RuntimeError(f"{self.source}: its scheduler set {len(pipe.scheduler.timesteps)} timesteps, not {self.steps}")

    def levels(self, image_tokens: int) -> list[float]:
        """The noise level of each step (1 = pure noise) for an image of ``image_tokens`` tokens."""
        pipe = self.pipeline_around(None)
        self.set_timesteps(pipe, image_tokens)
        return [float(s) for s in pipe.scheduler.sigmas[:-1]]


def image_tokens(inputs: dict[str, Any]) -> int:
    """The image's token count as the pipelines compute ``mu`` from it: a packed latent's sequence length, else a
    latent's (or Z-Image's per-sample latents') 2x2 patches."""
    latent = inputs["hidden_states"] if "hidden_states" in inputs else inputs["x"][0].unsqueeze(0)
    if latent.dim() == 3:
        return latent.shape[1]
    return (latent.shape[-2] // 2) * (latent.shape[-1] // 2)


_FLUX_SHIFT = {"base_image_seq_len": 256, "max_image_seq_len": 4096, "base_shift": 0.5, "max_shift": 1.15}

# FLUX.2 [klein] 4B's transformer (transformer/config.json of black-forest-labs/FLUX.2-klein-4B): 5 double- and 20
# single-stream blocks of 3072 wide, Qwen3-4B's three hidden layers (3 x 2560) as the prompt, no guidance embedding.
KLEIN_4B = {
    "num_layers": 5,
    "num_single_layers": 20,
    "num_attention_heads": 24,
    "joint_attention_dim": 7680,
    "guidance_embeds": False,
}

# Wan 2.2 T2V A14B's experts (Wan-AI/Wan2.2-T2V-A14B-Diffusers, transformer and transformer_2): Wan 2.1 14B's blocks.
WAN_A14B = {"num_attention_heads": 40, "ffn_dim": 13824, "num_layers": 40}

SCHEDULES: dict[str, Schedule] = {
    "flux-schnell": Schedule(
        "flux",
        "FluxPipeline",
        "black-forest-labs/FLUX.1-schnell",
        4,
        {**_FLUX_SHIFT, "shift": 1.0, "use_dynamic_shifting": False},
        1024,
        {"guidance_embeds": False},
    ),
    "flux2-klein": Schedule(
        "flux2",
        "Flux2KleinPipeline",
        "black-forest-labs/FLUX.2-klein-4B",
        4,
        {**_FLUX_SHIFT, "shift": 3.0, "use_dynamic_shifting": True, "time_shift_type": "exponential"},
        1024,
        KLEIN_4B,
    ),
    "z-image-turbo": Schedule(
        "z-image",
        "ZImagePipeline",
        "Tongyi-MAI/Z-Image-Turbo",
        8,
        {"shift": 3.0, "use_dynamic_shifting": False},
        1024,
    ),
    "qwen-image-lightning": Schedule(
        "qwen-image",
        "QwenImagePipeline",
        "lightx2v/Qwen-Image-Lightning (8 steps, on Qwen/Qwen-Image)",
        8,
        {
            "base_image_seq_len": 256,
            "max_image_seq_len": 8192,
            "base_shift": math.log(3),
            "max_shift": math.log(3),
            "shift": 1.0,
            "use_dynamic_shifting": True,
            "time_shift_type": "exponential",
        },
        1024,
        note="the scheduler config of its model card: a constant exponential shift of 3",
    ),
    "wan22-lightx2v": Schedule(
        "wan",
        "WanPipeline",
        "Wan-AI/Wan2.2-T2V-A14B-Diffusers + lightx2v's 4-step distillation LoRA",
        4,
        {"shift": 5.0, "use_dynamic_shifting": False},
        (480, 832, 81),
        WAN_A14B,
        sigmas=(1.0, 0.75, 0.5, 0.25),
        note="LightX2V's Euler recipe (timesteps 1000/750/500/250 at shift 5); one expert's blocks for all 4 steps",
    ),
    "ltx2-distilled": Schedule(
        "ltx2",
        "LTX2Pipeline",
        "Lightricks/LTX-2 distilled",
        8,
        {"shift": 1.0, "use_dynamic_shifting": False},
        (512, 768, 121),
        sigmas=(1.0, 0.99375, 0.9875, 0.98125, 0.975, 0.909375, 0.725, 0.421875),
        note="diffusers' DISTILLED_SIGMA_VALUES (pipelines/ltx2/utils.py)",
    ),
}


def schedule_named(name: str) -> Schedule:
    """The schedule of ``name``, or a ValueError listing the names."""
    if name not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {name!r}")
    return SCHEDULES[name]
