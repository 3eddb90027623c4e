"""The few-step rule of auto's default gate (tokenmerge.steps): a schedule of at most FEW_STEPS steps is recognised from
the pipeline's scheduler, ComfyUI's sigmas or the calls (never from a model's name), and its last steps are reduced
instead of those at noise <= 0.4; many-step schedules keep the noise rule."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import tokenmerge
from tokenmerge.config import TokenMergeConfig
from tokenmerge.methods.auto import AUTO_FEW_STEP_SHARE
from tokenmerge.planning import gated
from tokenmerge.steps import FEW_STEPS, StepPosition, StepTrack, position_in
from tokenmerge.tools.architectures import build_model, transformer_inputs

from conftest import AttentionCalls

# auto at a strength that acts on the small test models' grids (its default leaves grids of <= 1024 tokens alone)
AUTO = dict(method="auto", auto_max_keys=8, auto_min_tokens=16)


def _flow(steps: int, shift: float) -> list[float]:
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps))
    return (scheduler.timesteps / 1000).tolist()


def _ddim(steps: int) -> list[float]:
    from diffusers import DDIMScheduler

    scheduler = DDIMScheduler()
    scheduler.set_timesteps(steps)
    return (scheduler.timesteps.float() / 1000).tolist()


def _estimates(levels: list[float], repeat: int = 1) -> list[StepPosition | None]:
    track = StepTrack()
    return [track.observe(n) for n in levels for _ in range(repeat)][::repeat]


@pytest.mark.parametrize("levels", [_ddim(20), _ddim(50), _flow(12, 1.0), _flow(28, 1.0), _flow(28, 3.0), _flow(50, 3.16), _flow(20, 7.4)])
def test_a_many_step_schedule_is_never_taken_for_a_few_step_one_from_its_calls(levels):
    positions = _estimates(levels)
    assert positions[0] is None  # a generation's first step: no stride yet
    assert not any(p.few for p in positions[1:])
    config = TokenMergeConfig(method="auto")
    reduced = [i for i, (n, p) in enumerate(zip(levels, positions)) if not gated(config, n, p)]
    assert reduced == [i for i, n in enumerate(levels) if n <= 0.4 + 2**-9]  # the noise rule, unchanged


@pytest.mark.parametrize(
    "levels,few_from",
    [
        ([0.96, 0.72, 0.48, 0.24], 1),  # the distilled reference: evenly strided from 960
        (_ddim(8), 1),
        (_flow(4, 1.0), 1),  # FLUX.1 schnell
        (_flow(8, 3.0), 6),  # Z-Image-Turbo's shift: its stride grows, so its later steps tell
        (_flow(4, 7.4), 3),  # FLUX.2 Klein at 1024 px (mu about 2): every step above noise 0.7
    ],
)
def test_a_few_step_schedule_is_recognised_from_its_calls_cfg_free_and_with_cfg_halves_apart(levels, few_from):
    for repeat in (1, 2):  # CFG-free, or classifier-free guidance's halves called one after the other
        positions = _estimates(levels, repeat)
        assert [p is not None and p.few for p in positions] == [i >= few_from for i in range(len(levels))]
        assert all(p.index == i for i, p in enumerate(positions) if p is not None)
        assert all(p.total >= len(levels) for p in positions if p is not None)  # never too few
    track = StepTrack()
    for n in levels:
        track.observe(n)
    assert track.observe(1.0) is None  # the noise went back up: a new generation


def test_the_few_step_rule_reduces_the_last_share_of_a_known_schedule():
    config = TokenMergeConfig(method="auto")
    assert config.few_step_share == AUTO_FEW_STEP_SHARE
    for total in (1, 2, 4, 8, FEW_STEPS):
        positions = [StepPosition(i, total) for i in range(total)]
        reduced = [p.index for p in positions if not gated(config, 0.99, p)]  # at any noise level
        assert reduced == list(range(total - max(1, round(AUTO_FEW_STEP_SHARE * total + 0.49)), total))
    many = StepPosition(0, FEW_STEPS + 1)
    assert gated(config, 0.5, many) and not gated(config, 0.4, many)  # more steps: the noise rule
    assert TokenMergeConfig(method="auto", max_noise=0.4).few_step_share is None  # a max_noise given: its noise gate
    assert gated(TokenMergeConfig(method="auto", max_noise=0.4), 0.5, StepPosition(3, 4))
    assert TokenMergeConfig(method="todo").few_step_share is None  # tome/todo reduce every step by default
    # ComfyUI's sigmas end at 0, where no step runs; a level that is not the schedule's is not placed in it
    assert position_in([1.0, 0.75, 0.5, 0.25, 0.0], 0.5) == StepPosition(2, 4)
    assert position_in([1.0, 0.75, 0.5, 0.25], 0.6) is None


def _keys_per_call(model, inputs, noises, repeat=1):
    """The largest key count of each step's call(s) at these noise levels (Flux: timestep = noise)."""
    found = []
    for noise in noises:
        for _ in range(repeat):
            with torch.no_grad(), AttentionCalls() as calls:
                model(**{**inputs, "timestep": torch.full((inputs["timestep"].shape[0],), noise)})
        found.append(max(k.shape[-2] for _, k, _ in calls.calls))
    return found


@pytest.mark.parametrize("repeat", [1, 2], ids=["cfg-free", "cfg-halves-apart"])
def test_auto_reduces_a_4_step_loop_from_its_calls_and_a_28_step_one_by_noise(repeat):
    model = build_model("flux", small=True)
    inputs = transformer_inputs(model, "flux", 16, 16, batch=1)
    full = _keys_per_call(model, inputs, [1.0])[0]
    four = [0.96, 0.72, 0.48, 0.24]
    many = _flow(28, 3.0)
    with tokenmerge.patched(model, **AUTO), pytest.warns(UserWarning, match="reads a schedule of at least 5 steps from its calls"):
        keys = _keys_per_call(model, inputs, four, repeat)
    assert [k < full for k in keys] == [False, False, True, True]  # the last half, though noise 0.48 > 0.4
    with tokenmerge.patched(model, **AUTO):
        keys = _keys_per_call(model, inputs, many, repeat)
    assert [k < full for k in keys] == [n <= 0.4 for n in many]


def test_a_pipelines_scheduler_gives_the_schedule_exactly():
    from test_transformer_pipelines import flux_pipeline

    pipe, call = flux_pipeline(controlnet=False)
    pipe.set_progress_bar_config(disable=True)
    with AttentionCalls() as calls:
        pipe(**call, num_inference_steps=1, height=128, width=128, output_type="latent")
    full = max(k.shape[-2] for _, k, _ in calls.calls)
    tokenmerge.apply_patch(pipe, **AUTO)
    try:
        per_step: list[int] = []
        pipe.transformer.register_forward_hook(lambda *_: per_step.append(len(calls.calls)))
        with AttentionCalls() as calls, pytest.warns(UserWarning, match="reads a schedule of 4 steps from the pipeline's scheduler"):
            pipe(**call, num_inference_steps=4, height=128, width=128, output_type="latent")
        bounds = [0, *per_step]
        keys = [max(k.shape[-2] for _, k, _ in calls.calls[a:b]) for a, b in itertools.pairwise(bounds)]
    finally:
        tokenmerge.remove_patch(pipe)
    # FlowMatchEuler's 4 steps at this size run at noise 1, 0.75, 0.5, 0.25: exactly the last two are reduced (from its
    # calls alone the first reduced step would be the same here; the scheduler's count is exact from the first step)
    assert [k < full for k in keys] == [False, False, True, True]


def test_describe_counts_a_few_step_schedule_and_both_wan22_experts():
    from test_describe import _flux_pipeline, _wan22_pipeline

    pipe = _flux_pipeline()
    with tokenmerge.patched(pipe, method="auto"):
        text = str(tokenmerge.describe(pipe, size=1024, steps=4))
    assert "steps: reduces 2 of 4 (steps 3-4); the others are before the last 50% of a few-step schedule" in text
    pipe = _wan22_pipeline()
    with tokenmerge.patched(pipe, method="auto"):
        first, second = tokenmerge.describe(pipe, size=(480, 832), frames=81, steps=4).denoisers
    # 4 steps on Wan 2.2 A14B (its scheduler's shift: noise 0.999, 0.973, 0.923, 0.8; the experts' boundary 0.875): the
    # noisy expert runs three, the other the last; the last two steps are reduced, one by each expert
    assert first.steps.startswith("runs 3 of the 4 steps; reduces 1 of 3 (step 3); the others are before the last 50%")
    assert second.steps == "runs 1 of the 4 steps; reduces all 1"
    with tokenmerge.patched(pipe, method="auto"):
        first, second = tokenmerge.describe(pipe, size=(480, 832), frames=81, steps=40).denoisers
    assert second.steps.endswith("the others are at noise above max_noise=0.4")  # many steps: the noise rule


def test_comfyui_reads_the_schedule_from_the_samplers_sigmas():
    sampling = pytest.importorskip("comfy.model_sampling")
    from tokenmerge.integrations.comfyui import ComfyTokenMerge, comfy_levels

    class Flow(sampling.ModelSamplingDiscreteFlow, sampling.CONST):
        pass

    flow = Flow()
    sigmas = torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0])
    assert comfy_levels(flow, sigmas) == pytest.approx([1.0, 0.75, 0.5, 0.25])
    patch = ComfyTokenMerge(TokenMergeConfig(method="auto"), 1, model_sampling=flow)
    found = []
    with pytest.warns(UserWarning, match="reads a schedule of 4 steps from the sampler's sigmas"):
        for sigma in sigmas[:-1]:
            found.append(patch._noise({"sigmas": sigma.reshape(1), "sample_sigmas": sigmas}))
    assert [p for _, p in found] == [StepPosition(i, 4) for i in range(4)]
    assert [gated(patch.config, n, p) for n, p in found] == [True, True, False, False]
