"""What both ComfyUI routes share: a step's sigma and noise level read together (one host read), the noise levels of a
sampler's schedule, and :class:`SharedPatch`, the patch object one MODEL and its clones share, which says its
notices once per patch."""

from __future__ import annotations

import threading
from typing import Any

import torch

from ...config import TokenMergeConfig
from ...notices import SayOnce
from ...planning import gated
from ...steps import StepPosition, StepTrack, counts_steps, few_step_notice, gate_notice, locate


def model_sampling_of(model_patcher: Any) -> Any:
    """The MODEL's ``model_sampling`` (a sampling node's object patch included), or None."""
    get = getattr(model_patcher, "get_model_object", None)
    try:
        return get("model_sampling") if get is not None else model_patcher.model.model_sampling
    except AttributeError:
        return None


def comfy_noise(model_sampling: Any, sigma: Any) -> float | None:
    """The noise level of a ComfyUI step (1 = pure noise, 0 = clean): the timestep ``model_sampling`` gives its
    ``sigma`` (0..999 on SD models, sigma itself on flow models) as a fraction of the noisiest one. None where
    either is missing. One host read."""
    return comfy_step(model_sampling, sigma)[1]


def comfy_step(model_sampling: Any, sigma: Any) -> tuple[list[float] | None, float | None]:
    """A ComfyUI step's ``sigma`` values and noise level (:func:`comfy_noise`), read together: one host read (a
    device sync on a GPU). (None, None) where ``sigma`` is not a tensor; a noise level of None without
    ``model_sampling``."""
    if not isinstance(sigma, torch.Tensor):
        return None, None
    sigma = sigma.detach().float()
    if model_sampling is None:
        return sigma.flatten().tolist(), None
    level = model_sampling.timestep(sigma).max().double() / torch.as_tensor(model_sampling.timestep(model_sampling.sigma_max)).double()
    *values, noise = torch.cat([sigma.flatten().double(), level.reshape(1).to(sigma.device)]).tolist()
    return values, noise


def comfy_levels(model_sampling: Any, sample_sigmas: Any) -> list[float] | None:
    """The noise levels (as :func:`comfy_noise`) of the steps of a sampler's ``sample_sigmas`` (ComfyUI's
    ``transformer_options``; the final 0 is where the last step ends, not a step)."""
    if model_sampling is None or not isinstance(sample_sigmas, torch.Tensor) or sample_sigmas.numel() < 2:
        return None
    sigmas = sample_sigmas.detach().float().cpu()
    sigmas = sigmas[:-1] if float(sigmas[-1]) == 0 else sigmas
    top = float(model_sampling.timestep(model_sampling.sigma_max))
    return [float(model_sampling.timestep(s)) / top for s in sigmas]


class SharedPatch:
    """A patch object one patched MODEL and all its clones share: ``ModelPatcher.clone()`` deep-copies the model
    options, and a deep copy is the object itself (immutable apart from per-thread call state in ``_local``),
    which pickling leaves out."""

    _local: threading.local
    config: TokenMergeConfig

    def __init__(self, config: TokenMergeConfig, prefix: str = "") -> None:
        self.config = config
        self._local = threading.local()
        self.said = SayOnce(prefix)  # (one patch, one set of options: said once per patch)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_local"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def __deepcopy__(self, memo: dict) -> SharedPatch:
        return self

    def step_position(self, model_sampling: Any, options: Any, noise: float | None) -> StepPosition | None:
        """This step's position in its schedule where the default gate's few-step rule needs it: read from the
        sampler's ``sample_sigmas`` in the call's transformer ``options``, else estimated from this thread's steps
        (:mod:`tokenmerge.steps`). A few-step schedule is said once per patch."""
        if noise is None or self.config.few_step_share is None:
            return None
        levels = comfy_levels(model_sampling, options.get("sample_sigmas") if isinstance(options, dict) else None)
        position = locate(self._local.__dict__.setdefault("steps", StepTrack()), levels, noise)
        if position is not None and position.few:
            source = "the sampler's sigmas" if position.known else "its steps"
            self.said.say("few steps", few_step_notice(self.config, position, source))
        return position

    def notice_gate(self, noise: float | None, position: StepPosition | None) -> None:
        """A step the noise gate leaves whole is said once per patch (a few-step schedule is said apart)."""
        if self.said.pending("noise gate") and not counts_steps(self.config, position) and gated(self.config, noise, position):
            self.said.say("noise gate", gate_notice(self.config, noise, "max_noise=1 on the node reduces every step"))

    def step_noise(self, model_sampling: Any, sigma: Any, noise: float | None = None) -> float | None:
        """:func:`comfy_noise` of a step (``noise``: read already); where it cannot be read, one warning per patch
        that ``max_noise`` cannot act (its own flag: a warning about something else must not hide it)."""
        noise = comfy_noise(model_sampling, sigma) if noise is None else noise
        if noise is None:
            self.said.say(
                "noise unread",
                f"this step's noise level cannot be read, so max_noise={self.config.noise_limit:g} cannot act: every step is reduced",
            )
        return noise
