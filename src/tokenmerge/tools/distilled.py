"""The published few-step (distilled) models' sampling schedules, as their diffusers pipelines set them, for whole
few-step loops (``tokenmerge bench --schedule NAME``).

Each entry names the bench example whose architecture the model shares, the published transformer's config where it
differs from that example's, the scheduler config of the published checkpoint (``scheduler/scheduler_config.json``
or its model card's recipe) and how the pipeline's ``__call__`` sets its timesteps: the sigmas it passes
(``linspace(1, 1/N, N)`` unless the entry lists its own) and the ``mu`` of a dynamically shifted scheduler (from the
image's token count). The loop is the flow-matching Euler step every one of these schedulers takes; the patch sits on
the family's own pipeline around the transformer and that scheduler, so the few-step rule reads the schedule as it
does in a user's pipeline. Every one runs without classifier-free guidance (one call per step), as distilled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class Schedule:
    """How a published few-step model samples: ``model``: the bench example of its architecture; ``overrides``: its
    transformer's config keys that differ from the example's; ``scheduler``: FlowMatchEulerDiscreteScheduler's config;
    ``mu``: how the pipeline shifts a dynamic schedule (``"flux"``: diffusers' ``calculate_shift`` of the image
    tokens, ``"flux2"``: Flux.2 Klein's ``compute_empirical_mu``, None: no dynamic shift); ``sigmas``: the pipeline's
    own sigmas (empty: ``linspace(1, 1/N, N)``); ``size``: its default size in px (video: height, width, frames)."""

    model: str
    source: str
    steps: int
    scheduler: dict[str, Any]
    size: int | tuple[int, int, int]
    overrides: dict[str, Any] = field(default_factory=dict)
    mu: str | None = None
    sigmas: tuple[float, ...] = ()
    note: str = ""

    def scheduler_for(self) -> Any:
        """The published checkpoint's scheduler (timesteps not set yet)."""
        from diffusers import FlowMatchEulerDiscreteScheduler

        return FlowMatchEulerDiscreteScheduler(**self.scheduler)

    def set_timesteps(self, scheduler: Any, image_tokens: int) -> None:
        """Set ``scheduler``'s timesteps as the pipeline's ``__call__`` does for an image of ``image_tokens`` tokens
        (the packed latent's sequence length, which a dynamic shift reads)."""
        sigmas = list(self.sigmas) or np.linspace(1.0, 1 / self.steps, self.steps).tolist()
        kwargs: dict[str, Any] = {}
        if self.mu == "flux":
            from diffusers.pipelines.flux.pipeline_flux import calculate_shift

            c = scheduler.config
            kwargs["mu"] = calculate_shift(image_tokens, c.base_image_seq_len, c.max_image_seq_len, c.base_shift, c.max_shift)
        elif self.mu == "flux2":
            from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

            kwargs["mu"] = compute_empirical_mu(image_seq_len=image_tokens, num_steps=self.steps)
        scheduler.set_timesteps(sigmas=sigmas, **kwargs)
        if len(scheduler.timesteps) != self.steps:
            raise RuntimeError(f"{self.source}: its scheduler set {len(scheduler.timesteps)} timesteps, not {self.steps}")

    def levels(self, image_tokens: int) -> list[float]:
        """The noise level of each step (1 = pure noise) for an image of ``image_tokens`` tokens."""
        scheduler = self.scheduler_for()
        self.set_timesteps(scheduler, image_tokens)
        return [float(s) for s in scheduler.sigmas[:-1]]


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
        "black-forest-labs/FLUX.1-schnell",
        4,
        {**_FLUX_SHIFT, "shift": 1.0, "use_dynamic_shifting": False},
        1024,
        {"guidance_embeds": False},
        mu="flux",
    ),
    "flux2-klein": Schedule(
        "flux2",
        "black-forest-labs/FLUX.2-klein-4B",
        4,
        {**_FLUX_SHIFT, "shift": 3.0, "use_dynamic_shifting": True, "time_shift_type": "exponential"},
        1024,
        KLEIN_4B,
        mu="flux2",
    ),
    "z-image-turbo": Schedule(
        "z-image",
        "Tongyi-MAI/Z-Image-Turbo",
        8,
        {"shift": 3.0, "use_dynamic_shifting": False},
        1024,
        mu="flux",
    ),
    "qwen-image-lightning": Schedule(
        "qwen-image",
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
        mu="flux",
        note="the scheduler config of its model card: a constant exponential shift of 3",
    ),
    "wan22-lightx2v": Schedule(
        "wan",
        "Wan-AI/Wan2.2-T2V-A14B-Diffusers + lightx2v's 4-step distillation LoRA",
        4,
        {"shift": 5.0, "use_dynamic_shifting": False},
        (480, 832, 81),
        WAN_A14B,
        note="LightX2V's Euler recipe (timesteps 1000/750/500/250 at shift 5); one expert's blocks for all 4 steps",
    ),
    "ltx2-distilled": Schedule(
        "ltx2",
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


def family_pipeline(net: torch.nn.Module, scheduler: Any) -> Any:
    """The family's first diffusers pipeline around ``net`` and ``scheduler``, every other component None (no text
    encoder, no VAE: the loop calls the transformer itself), so that a patch on it reads the scheduler's steps as in
    a user's pipeline."""
    import inspect

    import diffusers

    from ..families import family_of

    family = family_of(net)
    if family is None or not family.pipelines:
        raise ValueError(f"{type(net).__name__} has no diffusers pipeline in the registry")
    cls = getattr(diffusers, family.pipelines[0])
    params = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "args", "kwargs")]
    components = {p: None for p in params if p not in ("transformer", "scheduler")}
    pipe = cls(**components, transformer=net, scheduler=scheduler)
    pipe.set_progress_bar_config(disable=True)
    return pipe
