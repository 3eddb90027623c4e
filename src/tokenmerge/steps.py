"""Where a call sits in its generation's schedule, and the few-step rule of a method's default gate.

Distilled models sample in a few steps (FLUX.1 schnell and FLUX.2 Klein 4, Z-Image-Turbo 8, LTX-2 distilled 8), and
their shifted schedules keep the noise high to the end (FLUX.2 Klein's 4 steps at 1024 px: all above 0.7), so a
noise gate such as ``auto``'s ``max_noise=0.4`` reduces none of them, while every step carries much of the image. On
a schedule of at most :data:`FEW_STEPS` steps such a default gate counts steps instead of noise: the last
``few_step_share`` of the steps are reduced (:meth:`StepPosition.in_last`).

A schedule is recognised from what the front end knows, never from a model's name: the diffusers pipeline's
scheduler (its ``timesteps`` as its ``__call__`` set them), ComfyUI's ``sample_sigmas``, else the calls themselves
(:class:`StepTrack`: the noise levels of a generation's steps so far, whose last stride bounds the steps left).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import TokenMergeConfig

FEW_STEPS = 10  # a schedule of at most this many steps is a few-step one (distilled models run 1-8)


@dataclass(frozen=True)
class StepPosition:
    """A call's step (0-based) in a schedule of ``total`` steps; ``known``: read from the sampler's schedule, not
    estimated from the calls."""

    index: int
    total: int
    known: bool = True

    @property
    def few(self) -> bool:
        return self.total <= FEW_STEPS

    def first_of_last(self, share: float) -> int:
        """The index of the first of the last ``share`` of the schedule's steps (at least one step)."""
        return self.total - max(1, math.ceil(share * self.total - 1e-9))

    def in_last(self, share: float) -> bool:
        """Whether this step is among the last ``share`` of the schedule's steps (at least one)."""
        return self.index >= self.first_of_last(share)


def counts_steps(config: TokenMergeConfig, position: StepPosition | None) -> bool:
    """Whether the gate of ``config`` counts steps at this ``position`` (a few-step schedule under a default gate with a
    few-step rule) instead of reading the noise level."""
    return config.few_step_share is not None and position is not None and position.few


def locate(track: StepTrack, levels: Sequence[float] | None, noise: float) -> StepPosition | None:
    """A call's position: in the sampler's schedule ``levels`` where they hold its ``noise``, else estimated from the
    generation's calls (``track`` observes every call, so the estimate stays whole where the schedule goes)."""
    estimate = track.observe(noise)
    return (levels and position_in(levels, noise)) or estimate


def position_in(levels: Sequence[float], current: float) -> StepPosition | None:
    """The position of a call at noise level ``current`` in a schedule whose steps run at ``levels`` (noisiest
    first; a final 0 that no step runs at, as ComfyUI's sigmas end, is not a step). None where no step is within
    1 % of it (a schedule that is not this generation's)."""
    steps = list(levels[:-1]) if len(levels) > 1 and levels[-1] == 0 else list(levels)
    if not steps:
        return None
    index = min(range(len(steps)), key=lambda i: abs(steps[i] - current))
    if abs(steps[index] - current) > 0.01 * max(abs(current), 1e-3):
        return None
    return StepPosition(index, len(steps))


def estimated(noises: Sequence[float]) -> StepPosition | None:
    """The position of the last of a generation's step noise levels ``noises`` (noisiest first) where the schedule is
    not known: its index, and as total the steps so far plus the noise left at the last stride. Strides stay
    constant (DDIM's evenly spaced timesteps) or grow toward the clean end (flow schedules shifted toward noise),
    so the estimate is exact or too high: a many-step schedule is never taken for a few-step one, and a shifted
    few-step one is recognised by its later steps. None at a generation's first step (no stride yet)."""
    if len(noises) < 2:
        return None
    stride = noises[-2] - noises[-1]
    if stride <= 0:
        return None
    left = math.floor(noises[-1] / stride + 1e-6)
    return StepPosition(len(noises) - 1, len(noises) + left, known=False)


def few_step_notice(config: TokenMergeConfig, position: StepPosition, source: str) -> str:
    """What the default gate does on a few-step schedule (said once per patch)."""
    share = config.few_step_share
    first = position.first_of_last(share) + 1
    estimate = "" if position.known else " at least"
    return (
        f"method={config.method!r} reads a schedule of{estimate} {position.total} steps from {source}: a few-step one (at "
        f"most {FEW_STEPS} steps), whose noise levels stay high (distilled models), so its default gate reduces the last "
        f"{share:.0%} of the steps (from step {first} of {position.total} on) instead of those at noise <= "
        f"{config.noise_limit:g}; max_noise=... sets a noise gate instead"
    )


def few_step_clause(config: TokenMergeConfig) -> str:
    """The default gate's own words in a noise-gate notice: on few-step schedules it counts steps instead."""
    share = config.few_step_share
    if share is None:
        return " (auto's default)"
    return f" ({config.method}'s default; on a schedule of at most {FEW_STEPS} steps, the last {share:.0%} of them instead)"


def gate_notice(config: TokenMergeConfig, noise: float, every_step: str) -> str:
    """What is said once where the noise gate leaves a call whole, in every front end's words alike;
    ``every_step``: how a user of that front end reduces every step."""
    default = few_step_clause(config) if config.max_noise is None else ""
    return (
        f"method={config.method!r} leaves this call whole: its noise level {noise:.3f} (1 = pure noise) is above "
        f"max_noise={config.noise_limit:g}{default}, so only the later, less noisy steps are reduced (flow models shift "
        f"their schedules toward noise: at large sizes or few steps none may be); {every_step} (faster, less faithful)"
    )


class StepTrack:
    """The noise levels of one thread's current generation, one per step: a call at the last step's level is the
    same step (classifier-free guidance's halves called apart), a noisier one starts a new generation."""

    def __init__(self) -> None:
        self.noises: list[float] = []

    def observe(self, noise: float) -> StepPosition | None:
        if not self.noises or noise > self.noises[-1]:
            self.noises = [noise]
        elif noise != self.noises[-1]:
            self.noises.append(noise)
        return estimated(self.noises)
