"""The published few-step models' schedules (tokenmerge.tools.distilled) behind ``tokenmerge bench --schedule``: the
sigmas their pipelines set, and auto's default reducing the last half of each one's steps when patched on the family's
own pipeline around the transformer and that scheduler (as in a user's pipeline)."""

from __future__ import annotations

import itertools

import pytest
import torch

import tokenmerge
from tokenmerge.tools.architectures import build_model, transformer_inputs
from tokenmerge.tools.cli import main
from tokenmerge.tools.distilled import SCHEDULES, image_tokens, schedule_named
from tokenmerge.tools.examples import examples
from tokenmerge.tools.loops import flow_loop

from conftest import AttentionCalls

AUTO = dict(method="auto", auto_max_keys=8, auto_min_tokens=16)  # a strength that acts on the tiny models' grids


def test_the_schedules_are_the_pipelines_sigmas():
    from diffusers.pipelines.ltx2.utils import DISTILLED_SIGMA_VALUES

    def rounded(name: str, tokens: int = 4096) -> list[float]:
        return [round(s, 3) for s in SCHEDULES[name].levels(tokens)]

    assert rounded("flux-schnell") == [1.0, 0.75, 0.5, 0.25]  # no shift: linspace(1, 1/4, 4)
    assert rounded("flux2-klein") == [1.0, 0.967, 0.908, 0.767]  # Klein's empirical mu at 1024 px: all above 0.7
    assert rounded("wan22-lightx2v") == [1.0, 0.938, 0.833, 0.625]  # LightX2V: timesteps 1000/750/500/250 at shift 5
    assert rounded("z-image-turbo") == rounded("qwen-image-lightning") == [1.0, 0.955, 0.9, 0.833, 0.75, 0.643, 0.5, 0.3]
    assert SCHEDULES["ltx2-distilled"].levels(0) == pytest.approx(DISTILLED_SIGMA_VALUES)
    assert all(s.model in examples() for s in SCHEDULES.values())
    with pytest.raises(ValueError, match="schedule must be one of flux-schnell, .*got 'schnell'"):
        schedule_named("schnell")


def _latent(name: str) -> dict:
    if examples()[name][1].frames:
        return dict(height=8, width=8, batch=1, text_tokens=5, frames=3)
    return dict(height=16, width=16, batch=1, text_tokens=5)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_auto_reduces_the_last_half_of_each_published_schedule_through_its_pipeline(schedule):
    plan = SCHEDULES[schedule]
    net = build_model(plan.model, small=True)
    inputs = transformer_inputs(net, plan.model, **_latent(plan.model))
    pipe = plan.pipeline_around(net)
    plan.set_timesteps(pipe, image_tokens(inputs))
    scheduler = pipe.scheduler
    clock = type("Clock", (), {"steps": plan.steps, "timestep": 1000.0})()
    ends: list[int] = []
    net.register_forward_hook(lambda *_: ends.append(len(calls.calls)))
    with AttentionCalls() as calls:
        flow_loop(net, plan.model, inputs, clock, scheduler.sigmas.tolist())
    full = [sum(k.shape[-2] for _, k, _ in calls.calls[a:b]) for a, b in itertools.pairwise([0, *ends])]
    ends.clear()
    with tokenmerge.patched(pipe, **AUTO), pytest.warns(UserWarning, match=f"schedule of {plan.steps} steps from the pipeline's scheduler"):
        with AttentionCalls() as calls:
            flow_loop(net, plan.model, inputs, clock, scheduler.sigmas.tolist())
    keys = [sum(k.shape[-2] for _, k, _ in calls.calls[a:b]) for a, b in itertools.pairwise([0, *ends])]
    half = plan.steps // 2
    assert [k < f for k, f in zip(keys, full)] == [False] * half + [True] * half


def test_bench_schedule_runs_the_published_models_loop(capsys):
    argv = ["bench", "--schedule", "flux2-klein", "--small", "--sizes", "128", "--repeats", "0", "--variants", "todo:2"]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "whole sampling loops of flux2-klein's 4 steps (its pipeline's scheduler, no CFG)" in table and "batch 1" in table


@pytest.mark.parametrize(
    "argv,error",
    [
        (["--model", "flux"], "runs flux2 in 4 diffusers steps"),
        (["--steps", "8"], "runs flux2 in 4 diffusers steps"),
        (["--variants", "auto+fbcache"], "a step cache has no steps to skip"),
    ],
)
def test_bench_schedule_refuses_what_it_cannot_do(argv, error, capsys):
    with pytest.raises(SystemExit, match=error):
        main(["bench", "--schedule", "flux2-klein", "--small", "--sizes", "128", *argv])


def test_the_published_configs_build_at_their_widths_on_the_meta_device():
    """The overrides are the published transformers' (FLUX.2 [klein] 4B: 3.9 B parameters; Wan 2.2 A14B's expert: 14 B)."""
    with torch.device("meta"):
        klein = build_model("flux2", overrides=SCHEDULES["flux2-klein"].overrides)
        wan = build_model("wan", overrides=SCHEDULES["wan22-lightx2v"].overrides)
    assert 3.7e9 < sum(p.numel() for p in klein.parameters()) < 4.1e9
    assert 13.5e9 < sum(p.numel() for p in wan.parameters()) < 14.5e9
