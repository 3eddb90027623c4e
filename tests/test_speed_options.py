"""The speed options: method="auto", share_plan, reuse_steps and match_dtype."""

from __future__ import annotations

import pytest
import torch

import tokenmerge
import tokenmerge.methods.tome
from tokenmerge.integrations.comfyui import patch_model
from tokenmerge.methods import auto_kv_factor
from tokenmerge.tools.comfy_models import build_comfy_patcher, comfy_run

from conftest import key_value_counts, max_rel_diff, sd_inputs


@pytest.mark.parametrize(("tokens", "factor"), [(64, 1), (1024, 1), (1025, 2), (4096, 3), (9216, 5), (16384, 6), (65536, 12)])
def test_auto_factor_leaves_small_grids_and_keeps_about_512_keys(tokens, factor):
    """SD 1.5's top level at 256, 512, 768, 1024 and 2048 px; defaults auto_max_keys=512, auto_min_tokens=1024."""
    assert auto_kv_factor(tokens, 512, 1024) == factor


@pytest.mark.parametrize(
    ("option", "value", "error"),
    [
        ("auto_max_keys", 0, ValueError),
        ("auto_min_tokens", -1, ValueError),
        ("share_plan", 1, TypeError),
        ("reuse_steps", 0, ValueError),
        ("reuse_steps", 1.5, TypeError),
        ("match_dtype", "fp8", ValueError),
    ],
)
def test_bad_speed_options_name_the_argument(sd15_small, option, value, error):
    with pytest.raises(error, match=option):
        tokenmerge.apply_patch(sd15_small, **{option: value})


def test_auto_downsamples_only_large_grids_on_every_level(sd15_small):
    inputs = sd_inputs(sd15_small, 32, 32)  # levels 1, 2, 4, 8: 1024, 256, 64 and 16 tokens
    with torch.no_grad():
        vanilla = sd15_small(**inputs).sample
        tokenmerge.apply_patch(sd15_small, method="auto", auto_max_keys=64, auto_min_tokens=64, max_noise=1, auto_max_factor=None)
        try:
            with key_value_counts(sd15_small) as seen:
                out = sd15_small(**inputs).sample
        finally:
            tokenmerge.remove_patch(sd15_small)
    assert {(q, kv) for q, kv in seen} == {(1024, 64), (256, 64), (64, 64), (16, 16)}  # factors 4, 2, 1, 1
    assert 0 < max_rel_diff(out, vanilla) < 0.5


def test_auto_leaves_small_grids_bit_identical(sd15_small):
    inputs = sd_inputs(sd15_small, 8, 8)  # at most 64 tokens on every level
    with torch.no_grad():
        vanilla = sd15_small(**inputs).sample
        tokenmerge.apply_patch(sd15_small, method="auto", auto_max_keys=64, auto_min_tokens=64, max_noise=1)
        try:
            assert torch.equal(sd15_small(**inputs).sample, vanilla)
        finally:
            tokenmerge.remove_patch(sd15_small)


def test_auto_respects_max_downsample(sd15_small):
    inputs = sd_inputs(sd15_small, 32, 32)
    tokenmerge.apply_patch(
        sd15_small, method="auto", auto_max_keys=64, auto_min_tokens=64, max_noise=1, auto_max_factor=None, max_downsample=1
    )
    try:
        with torch.no_grad(), key_value_counts(sd15_small) as seen:
            sd15_small(**inputs)
    finally:
        tokenmerge.remove_patch(sd15_small)
    assert {(q, kv) for q, kv in seen} == {(1024, 64), (256, 256), (64, 64), (16, 16)}


@pytest.fixture
def matching_calls(monkeypatch):
    """Count the matchings computed by the diffusers/ldm hooks."""
    calls: list[tuple[int, int]] = []
    real = tokenmerge.methods.tome.plan_merge

    def counting(x, grid, *args):
        calls.append(grid.shape)
        return real(x, grid, *args)

    monkeypatch.setattr(tokenmerge.methods.tome, "plan_merge", counting)
    return calls


def test_share_plan_matches_once_per_level_and_call(sd15_small, matching_calls):
    inputs = sd_inputs(sd15_small, 16, 16)
    with torch.no_grad():
        tokenmerge.apply_patch(sd15_small, ratio=0.5)
        per_block = sd15_small(**inputs).sample
        blocks = len(matching_calls)
        tokenmerge.apply_patch(sd15_small, ratio=0.5, share_plan=True)
        matching_calls.clear()
        shared = sd15_small(**inputs).sample
        assert matching_calls == [(16, 16)]
        sd15_small(**inputs)  # a new call matches again
        assert len(matching_calls) == 2
        tokenmerge.remove_patch(sd15_small)
    assert blocks > 1
    assert 0 < max_rel_diff(shared, per_block) < 0.5


def test_reuse_steps_counts_timestep_changes(sd15_small, matching_calls):
    inputs = sd_inputs(sd15_small, 16, 16)
    tokenmerge.apply_patch(sd15_small, ratio=0.5, reuse_steps=3)
    try:
        with torch.no_grad():
            for t in (999, 999, 900, 800, 700, 600):  # the repeated 999 is one step called twice (split CFG)
                sd15_small(**{**inputs, "timestep": torch.tensor(t)})
        merged = len(tokenmerge.describe(sd15_small).denoisers[0].patched_blocks)
        assert len(matching_calls) == 2 * merged  # steps 0 (999) and 3 (700)
        matching_calls.clear()
        tokenmerge.update_options(sd15_small, reuse_steps=2)  # new options: cached matchings are dropped
        with torch.no_grad():
            sd15_small(**{**inputs, "timestep": torch.tensor(600)})
        assert len(matching_calls) == merged
    finally:
        tokenmerge.remove_patch(sd15_small)


def test_reuse_steps_rematches_when_the_shape_changes(sd15_small, matching_calls):
    tokenmerge.apply_patch(sd15_small, ratio=0.5, reuse_steps=10, share_plan=True)
    try:
        with torch.no_grad():
            sd15_small(**sd_inputs(sd15_small, 16, 16))
            sd15_small(**sd_inputs(sd15_small, 16, 24))
            sd15_small(**sd_inputs(sd15_small, 16, 24, batch=1))
    finally:
        tokenmerge.remove_patch(sd15_small)
    assert matching_calls == [(16, 16), (16, 24), (16, 24)]


def test_bfloat16_matching_stays_close_to_exact(sd15_small):
    inputs = sd_inputs(sd15_small, 16, 16)
    with torch.no_grad():
        tokenmerge.apply_patch(sd15_small, ratio=0.5, use_rand=False)
        exact = sd15_small(**inputs).sample
        tokenmerge.update_options(sd15_small, match_dtype="bfloat16")
        low = sd15_small(**inputs).sample
        tokenmerge.remove_patch(sd15_small)
        vanilla = sd15_small(**inputs).sample
    assert max_rel_diff(low, exact) < 0.5 * max_rel_diff(exact, vanilla) + 1e-6


def test_comfyui_node_auto_and_unsupported_options():
    patcher = build_comfy_patcher("sd15-small", 0)
    g = torch.Generator().manual_seed(0)
    x, context = torch.randn(2, 4, 16, 16, generator=g), torch.randn(2, 77, 32, generator=g)
    vanilla = comfy_run(patcher, x, context=context)
    auto = comfy_run(
        patch_model(patcher, tokenmerge.TokenMergeConfig(method="auto", auto_max_keys=64, auto_min_tokens=64, max_noise=1)),
        x,
        context=context,
    )
    assert 0 < max_rel_diff(auto, vanilla) < 0.5

    with pytest.raises(ValueError, match="share_plan"):
        patch_model(patcher, tokenmerge.TokenMergeConfig(share_plan=True))


def test_reuse_steps_plan_from_inference_mode_is_reused_with_gradients(sd15_small):
    """A plan matched under torch.inference_mode() and reused in a later call that trains."""
    inputs = sd_inputs(sd15_small, 16, 16)
    with tokenmerge.patched(sd15_small, ratio=0.5, reuse_steps=3):
        with torch.inference_mode():
            sd15_small(**{**inputs, "timestep": torch.tensor(900)})
        out = sd15_small(**{**inputs, "timestep": torch.tensor(800)}).sample  # the same step window: plan reused
        out.square().mean().backward()
    grads = [p.grad for p in sd15_small.parameters() if p.grad is not None]
    sd15_small.zero_grad(set_to_none=True)
    assert grads and all(torch.isfinite(g).all() for g in grads)
