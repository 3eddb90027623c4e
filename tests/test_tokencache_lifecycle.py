"""The token cache's state follows its generation, whatever ends it, on every front end.

A diffusers pipeline's call is one generation (its schedule, set anew by each call, scopes it): an exception or an
interrupt leaves nothing that the next call reads, its last step records nothing and frees what was held, so memory
after any number of generations is memory after one. A loop of one's own is scoped by ``tokenmerge.generation``, and
without it holds a bounded number of generations. The webui begins a generation at each sampling's first step.
Schedules too short for the cache are said once, and ``describe(steps=N)`` counts the steps it caches.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from test_transformer_pipelines import flux_pipeline

import tokenmerge
from tokenmerge.methods.tokencache import MAX_SLOTS
from tokenmerge.patch import named_states
from tokenmerge.tools.architectures import at_noise, timestep_scale, transformer_inputs, transformer_output

from conftest import build_ldm_unet, ldm_inputs, model_of

OPTIONS = dict(method="tokencache", recompute=0.25, full_steps=1, refresh_every=3)


class StopError(Exception):
    pass


def _pipes():
    from diffusers import FluxImg2ImgPipeline

    pipe, call = flux_pipeline(False)
    pipe.set_progress_bar_config(disable=True)
    tokenmerge.apply_patch(pipe, **OPTIONS)
    img2img = FluxImg2ImgPipeline.from_pipe(pipe)  # another pipeline on the same patched transformer and scheduler
    img2img.set_progress_bar_config(disable=True)
    return pipe, img2img, call


def _held(pipe) -> int:
    return sum(state.cache_bytes() for _, state in named_states(pipe))


def _txt2img(pipe, call, steps=8, seed=0, **kwargs):
    generator = torch.Generator().manual_seed(seed)
    return pipe(num_inference_steps=steps, height=64, width=64, generator=generator, output_type="latent", **call, **kwargs).images


def _img2img(pipe, call):
    image = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    generator = torch.Generator().manual_seed(1)
    return pipe(image=image, strength=0.6, num_inference_steps=8, generator=generator, output_type="latent", **call).images


@pytest.mark.parametrize("stop", ["exception", "interrupt"])
def test_a_stopped_generation_leaves_nothing_the_next_call_reads(stop):
    """An exception raised in a step callback, or ``pipe._interrupt``, after the second step (its noise level above
    where the img2img call starts, so that noise levels alone would take it for the same generation): the img2img
    call on the same transformer equals that call alone, bit for bit, and ends holding nothing."""
    pipe, img2img, call = _pipes()
    alone = _img2img(img2img, call)

    def stop_after_two(p, i, t, kwargs):
        if i == 1:
            if stop == "exception":
                raise StopError
            p._interrupt = True
        return kwargs

    with contextlib.suppress(StopError):
        _txt2img(pipe, call, callback_on_step_end=stop_after_two)
    assert _held(pipe) > 0  # the stopped generation's cache, until the next generation begins
    assert torch.equal(_img2img(img2img, call), alone)
    assert _held(pipe) == 0


def test_memory_after_many_generations_is_memory_after_one():
    """Twenty one-step generations hold nothing during or after them (a last step records nothing); multi-step ones
    free their cache at their last step."""
    pipe, _, call = _pipes()
    during: list[int] = []

    def watch(p, i, t, kwargs):
        during.append(_held(p))
        return kwargs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a one-step schedule is said: test_a_schedule_too_short_is_said_once)
        for seed in range(20):
            _txt2img(pipe, call, steps=1, seed=seed, callback_on_step_end=watch)
    assert during == [0] * 20 and _held(pipe) == 0
    for seed in range(3):
        _txt2img(pipe, call, steps=6, seed=seed, callback_on_step_end=watch)
        assert _held(pipe) == 0
    assert max(during) > 0


def test_a_schedule_too_short_is_said_once_and_counted_by_describe():
    """At most ``full_steps`` steps: the output is the unpatched model's and that is said once, with the setting that
    lets the cache act; ``describe(steps=N)`` counts the steps it caches."""
    pipe, _, call = _pipes()
    tokenmerge.update_options(pipe, full_steps=3, refresh_every=6)  # the defaults
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        patched = [_txt2img(pipe, call, steps=3), _txt2img(pipe, call, steps=3)]
    said = [str(w.message) for w in caught if "none is cached" in str(w.message)]
    assert len(said) == 1 and "this schedule has 3 step(s)" in said[0] and "full_steps=1 or less" in said[0]
    assert all(w.filename == __file__ for w in caught if "none is cached" in str(w.message))
    assert "caches 0 of 3: all are computed fully" in tokenmerge.describe(pipe, size=64, steps=3).denoisers[0].steps
    with tokenmerge.patched(pipe, ratio=0.0):
        vanilla = _txt2img(pipe, call, steps=3)
    assert all(torch.equal(p, vanilla) for p in patched)
    tokenmerge.update_options(pipe, full_steps=1)
    assert "caches 1 of 3 (from step 3 on)" in tokenmerge.describe(pipe, size=64, steps=3).denoisers[0].steps
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not torch.equal(_txt2img(pipe, call, steps=3), vanilla)
    assert not [w for w in caught if "none is cached" in str(w.message)]


def test_a_few_step_schedule_is_cached_from_its_second_step():
    """Where full_steps and refresh_every are not given, a known schedule of at most 10 steps (a distilled model's)
    computes its first step fully and caches every later one (the preset's few-step share recomputed); a one-step
    schedule has nothing to cache and says so; full_steps given keeps its meaning."""
    pipe, _, call = _pipes()
    tokenmerge.update_options(pipe, recompute=None, full_steps=None, refresh_every=None)  # the quality preset
    assert "caches 3 of 4 (from step 2 on)" in tokenmerge.describe(pipe, size=64, steps=4).denoisers[0].steps
    assert "caches 20 of 28 (from step 5 on)" in tokenmerge.describe(pipe, size=64, steps=28).denoisers[0].steps
    with tokenmerge.patched(pipe, method="tome", ratio=0.0):
        vanilla = _txt2img(pipe, call, steps=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        patched = _txt2img(pipe, call, steps=4)
        _txt2img(pipe, call, steps=1)
    assert 0 < ((patched - vanilla).norm() / vanilla.norm()).item() < 0.5
    said = [str(w.message) for w in caught if "none is cached" in str(w.message)]
    assert len(said) == 1 and "this schedule has 1 step(s)" in said[0]
    tokenmerge.update_options(pipe, full_steps=3)
    assert "caches 0 of 4" in tokenmerge.describe(pipe, size=64, steps=4).denoisers[0].steps


def _calls(model, levels, seed=0):
    base = transformer_inputs(model, "flux", 8, 8, batch=1, seed=seed, text_tokens=5)
    return [at_noise(base, timestep_scale(model), level) for level in levels]


def _loop(model, calls):
    with torch.no_grad():
        return [transformer_output("flux", model(**c)) for c in calls]


def test_a_loop_of_ones_own_is_scoped_by_tokenmerge_generation():
    """Without a pipeline: a stopped loop then a loop starting below its noise level is one generation to the noise
    rule, unless ``tokenmerge.generation`` scopes each; one-step calls at one timestep hold at most MAX_SLOTS
    generations (a call at a slot's own noise level starts it afresh), and a scoped one holds nothing after it."""
    model = model_of("flux")
    with tokenmerge.patched(model, **OPTIONS):
        state = named_states(model)[0][1]
        later = _calls(model, [0.5, 0.4, 0.3, 0.2], seed=1)
        with tokenmerge.generation(model):
            alone = _loop(model, later)
        assert state.cache_bytes() == 0
        _loop(model, _calls(model, [1.0, 0.9, 0.8]))  # stopped after three steps
        unscoped = _loop(model, later)
        assert not all(torch.equal(a, b) for a, b in zip(unscoped, alone))
        _loop(model, _calls(model, [1.0, 0.9, 0.8]))
        with tokenmerge.generation(model):
            scoped = _loop(model, later)
        assert all(torch.equal(a, b) for a, b in zip(scoped, alone))
        for seed in range(10):
            _loop(model, _calls(model, [1.0], seed=seed))
        one = _loop(model, _calls(model, [1.0], seed=0))[0]
        generations = state.generations()
        assert len(generations.slots) <= MAX_SLOTS and sum(bool(g.outputs) for g in generations.slots) <= MAX_SLOTS
        with torch.no_grad():
            first = transformer_output("flux", model(**_calls(model, [1.0], seed=0)[0]))
        assert torch.equal(one, first)


def test_the_webui_begins_a_generation_at_each_samplings_first_step(monkeypatch):
    """AUTOMATIC1111: the ``on_cfg_denoiser`` callback at a sampling's step 0 frees what the last generation held
    (skipped or interrupted), so an img2img pass after it equals that pass alone; its step count lets the presets
    cache a few-step sampling from its second step."""
    import types

    from tokenmerge.integrations import webui

    callbacks: list = []
    shared = types.SimpleNamespace(opts=types.SimpleNamespace(), OptionInfo=lambda *a, **k: None, sd_model=None)
    script_callbacks = types.SimpleNamespace(on_ui_settings=lambda f: None, on_cfg_denoiser=callbacks.append)
    sd_models = types.SimpleNamespace(tomesd=None)
    assert webui.install(shared, script_callbacks, sd_models, types.SimpleNamespace()) == "automatic1111"
    unet = build_ldm_unet()
    shared.sd_model = unet
    tokenmerge.apply_patch(unet, ratio=0.5, **OPTIONS)
    x, _, context = ldm_inputs(16, 16, batch=1)

    def sample(levels):
        found = []
        with torch.no_grad():
            for i, level in enumerate(levels):
                for callback in callbacks:
                    callback(types.SimpleNamespace(sampling_step=i, total_sampling_steps=len(levels)))
                found.append(unet(x * (1 + level), torch.full((1,), 999.0 * level), context))
        return found

    alone = sample([0.5, 0.4, 0.3, 0.2])
    sample([1.0, 0.9, 0.8])  # skipped after three steps
    assert all(torch.equal(a, b) for a, b in zip(sample([0.5, 0.4, 0.3, 0.2]), alone))
    # the presets on a 4-step sampling: the callback's step count caches it from its second step
    tokenmerge.update_options(unet, recompute=None, full_steps=None, refresh_every=None)
    few = sample([0.8, 0.6, 0.4, 0.2])
    tokenmerge.remove_patch(unet)
    vanilla = sample([0.8, 0.6, 0.4, 0.2])
    assert torch.equal(few[0], vanilla[0]) and not torch.equal(few[-1], vanilla[-1])
