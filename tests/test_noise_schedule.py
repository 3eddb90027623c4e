"""``max_noise``: a reduction only in the low-noise steps, read from each family's timestep scale (and ComfyUI's
model sampling)."""

from __future__ import annotations

import pytest
import torch

import tokenmerge
from tokenmerge.config import AUTO_MAX_NOISE, TokenMergeConfig
from tokenmerge.methods import BlockFacts
from tokenmerge.planning import decide, noise_level
from tokenmerge.tools.architectures import build_model, transformer_inputs

from conftest import AttentionCalls, sd_inputs


def test_max_noise_default_is_the_methods_and_its_checks():
    for method in ("tome", "todo"):
        assert TokenMergeConfig(method=method).noise_limit == 1.0  # tomesd's behaviour: every step
    assert TokenMergeConfig(method="auto").noise_limit == AUTO_MAX_NOISE == 0.4  # the quality-first auto
    assert TokenMergeConfig(method="auto", max_noise=1).noise_limit == 1.0  # its speed-first setting
    assert TokenMergeConfig(method="tome", max_noise=0.4).noise_limit == 0.4
    for bad in (0, -0.1, 1.5, float("nan"), "half", True):
        with pytest.raises((ValueError, TypeError), match="max_noise must be None or a number in \\(0, 1\\]"):
            TokenMergeConfig(max_noise=bad)


def test_decide_leaves_steps_noisier_than_the_limit_alone():
    from tokenmerge.algorithms import TokenGrid

    config, grid = TokenMergeConfig(method="todo", max_noise=0.5), TokenGrid((32, 32))
    facts = lambda noise: BlockFacts(level=1, top_level=1, grid=grid, noise=noise)  # noqa: E731
    assert decide(config, facts(0.51)).idle and "noise level above max_noise=0.5" in decide(config, facts(0.51)).reason
    assert decide(config, facts(0.5)).kv_factors == (2, 2)
    assert decide(config, facts(None)).kv_factors == (2, 2)  # not read: every step


def test_noise_level_reads_each_scale_and_the_noisiest_entry():
    assert noise_level(torch.tensor(750), (1000.0, 0.0)) == 0.75
    assert noise_level(torch.tensor([0.25, 0.5]), (1.0, 0.0)) == 0.5
    assert noise_level(torch.tensor([0.9]), (0.0, 1.0)) == pytest.approx(0.1)  # Lumina 2 / Z-Image count from noise to clean
    per_token = torch.full((1, 8), 300.0)
    per_token[:, :4] = 0.0  # a clean condition frame (Wan 2.2 TI2V): the sample's step is the largest
    assert noise_level(per_token, (1000.0, 0.0)) == 0.3


def _keys(model, inputs):
    with torch.no_grad(), AttentionCalls() as calls:
        model(**inputs)
    return [k.shape[-2] for _, k, _ in calls.calls]


def test_auto_reduces_a_unet_only_at_low_noise(sd15_small):
    inputs = sd_inputs(sd15_small, 16, 16)
    vanilla = _keys(sd15_small, inputs)
    with tokenmerge.patched(sd15_small, method="todo", kv_factor=2, max_noise=0.5):
        noisy = _keys(sd15_small, {**inputs, "timestep": torch.tensor(510)})
        clean = _keys(sd15_small, {**inputs, "timestep": torch.tensor(500)})
        with torch.no_grad():
            out = sd15_small(**{**inputs, "timestep": torch.tensor(900)}).sample
    with torch.no_grad():
        ref = sd15_small(**{**inputs, "timestep": torch.tensor(900)}).sample
    assert noisy == vanilla and torch.equal(out, ref)  # a noisier step runs unchanged, bit for bit
    assert sum(clean) < sum(vanilla)


@pytest.mark.parametrize(("name", "noisy", "clean"), [("flux", 0.8, 0.2), ("lumina2", 0.2, 0.8), ("sd3", 800.0, 200.0)])
def test_each_family_reads_its_own_timestep_scale(name, noisy, clean):
    model = build_model(name, small=True)
    inputs = transformer_inputs(model, name, 8, 8, batch=1, seed=0, text_tokens=5)
    key = next(k for k in ("timestep", "timesteps", "t") if k in inputs)
    at = lambda t: {**inputs, key: torch.full_like(inputs[key], t)}  # noqa: E731
    vanilla = _keys(model, at(noisy))
    with tokenmerge.patched(model, method="todo", kv_factor=2, max_noise=0.5):
        assert _keys(model, at(noisy)) == vanilla
        assert sum(_keys(model, at(clean))) < sum(vanilla)


def test_a_denoiser_without_a_timestep_says_max_noise_cannot_act(sd15_small, monkeypatch):
    from tokenmerge.hooks import calls

    monkeypatch.setattr(calls.BeginCall, "_timestep", lambda self, args, kwargs: None)
    inputs = sd_inputs(sd15_small, 16, 16)
    vanilla = _keys(sd15_small, inputs)
    with tokenmerge.patched(sd15_small, method="todo", kv_factor=2, max_noise=0.5):
        with pytest.warns(UserWarning, match="max_noise=0.5 cannot act: every step is reduced"):
            reduced = _keys(sd15_small, inputs)
    assert sum(reduced) < sum(vanilla)


def test_comfyuis_noise_level_from_its_model_sampling():
    sampling = pytest.importorskip("comfy.model_sampling")

    class Eps(sampling.ModelSamplingDiscrete, sampling.EPS):
        pass

    class Flow(sampling.ModelSamplingDiscreteFlow, sampling.CONST):
        pass

    from tokenmerge.integrations.comfyui import comfy_noise

    eps = Eps()
    assert comfy_noise(eps, eps.sigma_max.reshape(1)) == pytest.approx(1.0)
    assert comfy_noise(eps, eps.sigma(torch.tensor([499.5]))) == pytest.approx(0.5, abs=1e-3)
    flow = Flow()
    assert comfy_noise(flow, torch.tensor([0.3])) == pytest.approx(0.3)
    assert comfy_noise(None, torch.tensor([0.3])) is None
    from tokenmerge.tools.comfy_models import sigma_at_noise

    for model_sampling in (eps, flow):  # the ComfyUI benches' step: the sigma at a noise level, by bisection
        assert comfy_noise(model_sampling, torch.tensor([sigma_at_noise(model_sampling, 0.25)])) == pytest.approx(
            0.25, abs=1e-3
        )  # eps: whole timesteps


def test_the_comfyui_unet_node_reduces_only_the_low_noise_steps():
    pytest.importorskip("comfy.model_sampling")
    from tokenmerge.integrations.comfyui import TokenMergeNode
    from tokenmerge.tools.comfy_models import build_comfy_patcher, comfy_run

    unet = build_comfy_patcher("sd15-small")
    x = torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(0))
    context = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(1))
    patched = TokenMergeNode().patch(unet, method="todo", kv_factor=2, max_noise=0.5)[0]
    noisy, clean = 10.0, 0.3  # SD's sigmas: noise levels about 0.9 and 0.2
    assert torch.equal(comfy_run(patched, x, noisy, context), comfy_run(unet, x, noisy, context))
    assert not torch.equal(comfy_run(patched, x, clean, context), comfy_run(unet, x, clean, context))
    default = TokenMergeNode().patch(unet, method="todo", kv_factor=2)[0]  # the widget's 0: every step
    assert not torch.equal(comfy_run(default, x, noisy, context), comfy_run(unet, x, noisy, context))


def test_describe_and_the_frontier_name_the_schedule(sd15_small):
    from tokenmerge.tools.evaluate import Result, frontier_groups
    from tokenmerge.tools.specs import PatchSpec

    with tokenmerge.patched(sd15_small, method="auto", max_noise=0.4):
        assert "in the steps at noise level <= 0.4" in str(tokenmerge.describe(sd15_small))
    names = [PatchSpec.parse(f"auto,auto_max_keys=128,max_noise={n}").name for n in (1, 0.4)]
    groups = frontier_groups([Result(names[0], speedup=1.5), Result(names[1], speedup=1.2), Result("tokenmerge r=0.5")])
    assert [r.name for r in groups["tokenmerge auto auto_max_keys=128 (max_noise)"]] == names[::-1]


def test_auto_max_factor_caps_the_budgets_factor_on_images_and_videos():
    from tokenmerge.algorithms import TokenGrid
    from tokenmerge.methods import auto_kv_factor, auto_kv_factors

    assert TokenMergeConfig().auto_max_factor == 3  # the default cap
    assert auto_kv_factor(256 * 256, 512, 1024) == 12  # SD 1.5 at 2048 px, the budget alone
    assert auto_kv_factor(256 * 256, 512, 1024, 3) == 3
    assert auto_kv_factor(64 * 64, 512, 1024, 3) == 3 and auto_kv_factor(32 * 32, 512, 1024, 3) == 1
    assert auto_kv_factors(TokenGrid((21, 45, 80)), 512, 1024, 2) == (2, 2, 2)  # Wan 720p: 2x3x3 uncapped
    for bad in (1, 0, 2.5, "3"):
        with pytest.raises((ValueError, TypeError), match="auto_max_factor must be None or an int >= 2"):
            TokenMergeConfig(method="auto", auto_max_factor=bad)
    with pytest.warns(UserWarning, match="does not use auto_max_factor=None"):
        TokenMergeConfig(method="tome", auto_max_factor=None).warn_if_ignored()


def test_the_quality_first_auto_caps_and_schedules_a_unet(sd15_small):
    inputs = sd_inputs(sd15_small, 24, 24)  # 576 top-level tokens: this budget alone would pick factor 9
    vanilla = _keys(sd15_small, inputs)
    with tokenmerge.patched(sd15_small, method="auto", auto_max_keys=8, auto_min_tokens=64):  # auto's defaults otherwise
        assert "keys/values 576 -> 64 (factor 3" in str(tokenmerge.describe(sd15_small, grid=(24, 24)))
        assert "noise level <= 0.4" in str(tokenmerge.describe(sd15_small, grid=(24, 24)))
        low = _keys(sd15_small, {**inputs, "timestep": torch.tensor(400)})
        mid = _keys(sd15_small, {**inputs, "timestep": torch.tensor(500)})
    assert 64 in low  # 8x8 keys of the capped factor 3
    assert mid == vanilla  # a mid-noise step runs whole


def test_an_unreadable_noise_level_is_said_even_after_another_warning():
    from tokenmerge.integrations.comfyui import ComfyTokenMerge

    patch = ComfyTokenMerge(TokenMergeConfig(method="todo", max_noise=0.5), 1, model_sampling=None)
    patch.said.say("grid", "a grid warning")  # another warning of this patch fired already
    with pytest.warns(UserWarning, match="max_noise=0.5 cannot act: every step is reduced"):
        assert patch._noise({"sigmas": torch.tensor([1.0])}) == (None, None)
