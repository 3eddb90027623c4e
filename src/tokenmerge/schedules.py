"""The noise levels a diffusers pipeline's denoising steps run at, as its own code computes them: what the noise gate
(``max_noise``) will leave whole in a generation, before it runs (:func:`tokenmerge.describe` with ``steps=``).

Flow pipelines shift their schedules toward noise, by the token count where their scheduler shifts dynamically
(Flux, Qwen-Image, Z-Image, Chroma, Lumina 2, LTX: ``calculate_shift`` of the image's tokens; Flux.2:
``compute_empirical_mu`` of the tokens and the steps), and pass sigmas of their own (``np.linspace(1, 1/N, N)`` in
most). Each is read from the pipeline's module and its ``__call__``, never from a model's name; a scheduler that
shifts by a fixed amount (SD3, Wan) or not at all (DDIM) is asked directly. Imports no model library: the pipeline
object brings its own.
"""

from __future__ import annotations

import copy
import inspect
import sys
from collections.abc import Sequence
from typing import Any

# How pipelines' __call__ build their sigmas (a source fragment -> the sigmas for N steps, with numpy), in order.
_SIGMAS = (
    ("np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)", lambda np, n: np.linspace(1.0, 1 / n, n)),
    ("get_default_z_image_sigmas(num_inference_steps)", lambda np, n: np.linspace(1.0, 1 / n, n)),
    ("np.linspace(1.0, 0.0, num_inference_steps + 1)[:-1]", lambda np, n: np.linspace(1.0, 0.0, n + 1)[:-1]),
)


def pipeline_timesteps(pipe: Any, steps: int, tokens: int) -> list[float]:
    """The timesteps (on the scheduler's 0..num_train_timesteps scale) of a ``steps``-step generation of ``pipe`` whose
    image (or video) has ``tokens`` tokens, as its ``__call__`` sets its scheduler (a copy of it is set here)."""
    scheduler = copy.deepcopy(pipe.scheduler)
    set_timesteps(pipe, scheduler, steps, tokens)
    return [float(t) for t in scheduler.timesteps]


def set_timesteps(pipe: Any, scheduler: Any, steps: int, tokens: int, sigmas: Sequence[float] | None = None) -> None:
    """Set ``scheduler``'s timesteps for a ``steps``-step generation of ``pipe`` on ``tokens`` tokens as its ``__call__``
    does: its default sigmas, or ``sigmas`` where a caller passes its own (a distilled model's), and the ``mu`` of a
    dynamically shifted scheduler."""
    import numpy as np

    module = sys.modules.get(type(pipe).__module__)
    try:
        source = inspect.getsource(type(pipe).__call__)
    except (OSError, TypeError):
        source = ""
    accepts = inspect.signature(scheduler.set_timesteps).parameters
    kwargs: dict[str, Any] = {}
    config = scheduler.config
    if config.get("use_dynamic_shifting") and "mu" in accepts:
        if "compute_empirical_mu(" in source and hasattr(module, "compute_empirical_mu"):
            kwargs["mu"] = module.compute_empirical_mu(tokens, steps)
        elif hasattr(module, "calculate_shift"):
            kwargs["mu"] = module.calculate_shift(
                tokens,
                config.get("base_image_seq_len", 256),
                config.get("max_image_seq_len", 4096),
                config.get("base_shift", 0.5),
                config.get("max_shift", 1.15),
            )
    if sigmas is None and "sigmas" in accepts:
        sigmas = next((make(np, steps) for fragment, make in _SIGMAS if fragment in source), None)
    if sigmas is not None:
        scheduler.set_timesteps(sigmas=list(sigmas), **kwargs)
    else:
        scheduler.set_timesteps(steps, **kwargs)


def noise_of(pipe: Any, timestep: float) -> float:
    """The noise level (1 = pure noise) of a scheduler timestep: its fraction of the training timesteps."""
    return timestep / pipe.scheduler.config.num_train_timesteps


def expert_steps(pipe: Any, component: str, timesteps: list[float]) -> list[int]:
    """The steps (indices into ``timesteps``) that ``component`` runs: all of them, or, in a pipeline with two experts
    split at ``boundary_ratio`` (Wan 2.2), the noisy ones (t >= the boundary) for ``transformer`` and the rest for
    ``transformer_2``."""
    ratio = getattr(getattr(pipe, "config", None), "boundary_ratio", None)
    if ratio is None or getattr(pipe, "transformer_2", None) is None or component not in ("transformer", "transformer_2"):
        return list(range(len(timesteps)))
    boundary = ratio * pipe.scheduler.config.num_train_timesteps
    noisy = component == "transformer"
    return [i for i, t in enumerate(timesteps) if (t >= boundary) == noisy]
