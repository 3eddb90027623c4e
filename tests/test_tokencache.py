"""``method="tokencache"``: token-wise caching across the steps of a generation, on every family of the registry.

Every family: full steps bit-identical to vanilla, the steps between them close to it with less work; a cached step
that recomputes every token equals vanilla (the gathered tokens, their rotary rows and masks, and the keys and values
of the others all line up); removal leaves nothing. Then the state: generations start afresh, classifier-free
guidance's halves called apart keep their own caches, threads do not mix, images do not depend on their batch; the
options; composition with a step cache; the UNet routes (diffusers and ldm).
"""

from __future__ import annotations

import dataclasses
import gc
import threading
import warnings
import weakref

import pytest
import torch

import tokenmerge
from tokenmerge.methods import tokencache
from tokenmerge.tools.architectures import at_noise, build_model, timestep_scale, transformer_inputs, transformer_output
from tokenmerge.tools.caches import Clock
from tokenmerge.tools.examples import examples
from tokenmerge.tools.loops import flow_loop
from tokenmerge.tools.work import count

from conftest import build_ldm_unet, hook_count, ldm_inputs, model_of, sample_of

EXAMPLES = tuple(name for name, (family, _) in examples().items() if "tokencache" in family.methods)
LATENT = (18, 14)  # a 9x7 token grid: odd and not square
OPTIONS = dict(method="tokencache", recompute=0.25, full_steps=1, refresh_every=3)
FULL, CACHED = (0, 1, 4), (2, 3, 5)  # of a 6-call generation under OPTIONS


def _latent_key(inputs: dict) -> str:
    return next(k for k in ("hidden_states", "x", "sample") if k in inputs)


def generation(name: str, batch: int = 2, seed: int = 0, calls: int = 6) -> list[dict]:
    """A generation's calls: the noise level falling from 1 to 0.2, the latent drifting slowly."""
    model = model_of(name)
    base = transformer_inputs(model, name, *LATENT, batch=batch, seed=seed, text_tokens=5)
    key = _latent_key(base)
    found = []
    for i, level in enumerate(torch.linspace(1.0, 0.2, calls).tolist()):
        inputs = at_noise(base, timestep_scale(model), level)
        latent = base[key]
        inputs[key] = [t * (1 - 0.03 * i) for t in latent] if isinstance(latent, list) else latent * (1 - 0.03 * i)
        found.append(inputs)
    return found


def run(name: str, calls: list[dict]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [transformer_output(name, model_of(name)(**inputs)) for inputs in calls]


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_family_caches_tokens_between_full_steps(name):
    """Full steps (the first, then every third) bit-identical to vanilla; between them a quarter of the image tokens
    recomputed: close to vanilla, with less linear-layer work; removal leaves no hook and frees the cache."""
    model, calls = model_of(name), generation(name)
    vanilla = run(name, calls)
    hooks = hook_count(model)
    work = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenmerge.apply_patch(model, **OPTIONS)
        outputs = []
        for i, inputs in enumerate(calls):
            counted = count(lambda inputs=inputs: outputs.append(run(name, [inputs])[0]))
            work[i] = counted.macs["linear"]
    (patch,) = [s for _, s in tokenmerge.hooks.states_in([model])]
    held = next(t for g in patch.generations().slots for t in g.outputs.values())
    tokenmerge.remove_patch(model)
    for i in FULL:
        assert torch.equal(outputs[i], vanilla[i]), f"full step {i} differs from vanilla"
    for i in CACHED:
        assert not torch.equal(outputs[i], vanilla[i]), f"cached step {i} equals vanilla: nothing was cached"
        assert relative(outputs[i], vanilla[i]) < 0.3
        assert work[i] < 0.9 * work[0], f"cached step {i}: {work[i]} linear MACs against {work[0]} on a full step"
    assert hook_count(model) == hooks
    reference = weakref.ref(held)
    del held, patch
    gc.collect()
    assert reference() is None, "the cache outlives remove_patch"


@pytest.mark.parametrize("name", EXAMPLES)
def test_a_cached_step_that_recomputes_every_token_equals_vanilla(name, monkeypatch):
    """With a window of one token every image token is gathered, run and scattered back, its attention handed the
    keys and values of the span's cache: the output equals vanilla up to float rounding. (Any misplaced rotary row,
    mask column or key would show.)"""
    monkeypatch.setattr(tokencache, "window_of", lambda config, steps=None: 1)
    calls = generation(name, calls=4)
    vanilla = run(name, calls)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tokenmerge.patched(model_of(name), **OPTIONS):
            outputs = run(name, calls)
    for i in (2, 3):
        assert relative(outputs[i], vanilla[i]) < 1e-5, f"step {i}: {relative(outputs[i], vanilla[i])}"


@pytest.mark.parametrize("name", EXAMPLES)
def test_caches_written_in_place_are_not_changed_by_the_blocks(name, monkeypatch):
    """Kept exactly (``cache_dtype=None``), a cached step writes its recomputed rows into the caches in place and hands
    a span's caller the output cache itself, the attention the cached keys and values: a block that added to them in
    place would poison the steps after it. The outputs equal those of caches copied before they are handed on."""
    calls = generation(name)

    def patched_run() -> list[torch.Tensor]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with tokenmerge.patched(model_of(name), **OPTIONS, cache_dtype=None):
                return run(name, calls)

    in_place = patched_run()
    scatter, fill_keys = tokencache.SelectSpan.scatter, tokencache.SelectSpan.fill_keys
    monkeypatch.setattr(tokencache.SelectSpan, "scatter", lambda self, y, span=0: scatter(self, y, span).clone())
    monkeypatch.setattr(
        tokencache.SelectSpan,
        "fill_keys",
        lambda self, *args: tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in fill_keys(self, *args)),
    )
    copied = patched_run()
    for i, (a, b) in enumerate(zip(in_place, copied)):
        assert torch.equal(a, b), f"call {i}: {relative(a, b)}"


def test_a_generation_may_mix_inference_mode_and_text_lengths():
    """Caches that a call cannot write in place are copied once, not an error: those made under
    ``torch.inference_mode`` and written outside it (the outputs are as if every call ran under ``no_grad``), and
    keys and values recorded with another text length (the image tokens' kept)."""
    calls = generation("flux")
    with tokenmerge.patched(model_of("flux"), **OPTIONS):
        plain = run("flux", calls)
        mixed = []
        for i, inputs in enumerate(calls):
            with torch.inference_mode(i % 2 == 0):
                mixed.append(run("flux", [inputs])[0].clone())
        longer = generation("flux")
        for i in (2, 3):  # cached steps with 7 text tokens against the full step's 5
            text = transformer_inputs(model_of("flux"), "flux", *LATENT, batch=2, text_tokens=7)
            longer[i] = {**longer[i], **{k: text[k] for k in text if k in ("encoder_hidden_states", "txt_ids")}}
        found = run("flux", longer)
    assert all(torch.equal(a, b) for a, b in zip(mixed, plain))
    assert all(torch.isfinite(t).all() for t in found) and relative(found[2], plain[2]) < 0.5


def test_recompute_one_is_the_identity():
    calls = generation("flux", calls=5)
    vanilla = run("flux", calls)
    with tokenmerge.patched(model_of("flux"), method="tokencache", recompute=1, full_steps=0, refresh_every=9):
        assert all(torch.equal(a, b) for a, b in zip(run("flux", calls), vanilla))
        assert "0 of 3 blocks patched" in str(tokenmerge.describe(model_of("flux"), (8, 8)))


def test_a_preset_gives_its_settings_and_the_options_given_override_them():
    """preset="fast" runs as its four settings given by hand (bit for bit), an option given overrides its preset's
    value, and the default preset is the quality one."""
    fast = tokencache.PRESETS["fast"]
    assert tokencache.settings(tokenmerge.TokenMergeConfig(method="tokencache")) == tokencache.PRESETS["quality"]
    given = tokenmerge.TokenMergeConfig(method="tokencache", preset="fast", full_steps=0)
    assert tokencache.settings(given) == dataclasses.replace(fast, full_steps=0)
    calls = generation("flux", calls=8)
    outputs = []
    for options in (dict(preset="fast", full_steps=1), dict(recompute=0.05, refresh_every=14, full_steps=1, forecast=0.0)):
        with tokenmerge.patched(model_of("flux"), method="tokencache", **options):
            outputs.append(run("flux", calls))
    assert all(torch.equal(a, b) for a, b in zip(*outputs))
    assert not torch.equal(outputs[0][-1], run("flux", calls[-1:])[0])  # (and it acted)


def test_a_new_generation_starts_afresh():
    """A second generation (the noise level back up) repeats the first's outputs exactly: nothing carries over; another
    batch size starts afresh too."""
    calls = generation("flux")
    with tokenmerge.patched(model_of("flux"), **OPTIONS):
        first, second = run("flux", calls), run("flux", calls)
        single = run("flux", generation("flux", batch=1))
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    alone = [run("flux", [c])[0] for c in generation("flux", batch=1)[:2]]
    assert all(torch.equal(a, b) for a, b in zip(single[:2], alone))  # its full steps: vanilla's


def test_guidance_halves_called_apart_keep_their_own_caches():
    """Classifier-free guidance called as two calls per step (conditional, then unconditional): each half's outputs
    are those of a generation of that half alone."""
    cond, uncond = generation("flux", seed=0), generation("flux", seed=1)
    with tokenmerge.patched(model_of("flux"), **OPTIONS):
        alone = run("flux", cond)
    with tokenmerge.patched(model_of("flux"), **OPTIONS):
        both = run("flux", [c for pair in zip(cond, uncond) for c in pair])
    assert all(torch.equal(a, b) for a, b in zip(both[0::2], alone))


@pytest.mark.parametrize(("name", "around"), [("wan", True), ("wan-i2v", True), ("wan-ti2v", False), ("flux", False)])
def test_a_block_keeps_one_residual_where_its_family_declares_it(name, around):
    """A Wan block runs whole on the tokens it recomputes and keeps one residual per token (its output less its input)
    instead of its three spans' outputs; where an argument of the block has a row per token (Wan 2.2 TI2V's per-token
    modulation) it keeps its spans' outputs, as blocks of families that declare nothing (Flux: measured 3 dB worse
    with a residual) do. Nothing is said either way."""
    model = model_of(name)
    with warnings.catch_warnings(record=True) as caught, tokenmerge.patched(model, **OPTIONS):
        warnings.simplefilter("always")
        run(name, generation(name))
        (patch,) = [s for _, s in tokenmerge.hooks.states_in([model])]
        (slot,) = [g for g in patch.generations().slots if g.outputs]
        kept = {span for _, span in slot.outputs}
        sites = {block for block, _ in slot.keys}
    assert kept == ({tokencache.AROUND_BLOCK} if around else set(range(max(len(b.layout.spans) for b in patch.blocks)))), kept
    assert sites == {b.index for b in patch.blocks}  # every block's self-attention keys and values, either way
    assert not [w for w in caught if "tokenmerge" in str(w.message)]


def test_forecast_extrapolates_an_output_that_changes_linearly_exactly():
    """``forecast=1``: a token's cached output moves on along its change per step between its last two computations
    (each computation, full or cached, divides by the steps since the token was last computed); an output linear in
    the step comes out exact at the cached steps, whichever tokens each recomputed."""
    g = torch.Generator().manual_seed(0)
    base, change = torch.randn(2, 6, 8, generator=g), torch.randn(2, 6, 8, generator=g)
    generation = tokencache.Generation(key=None, forecast=1.0)

    def at(step: int) -> torch.Tensor:
        return base + step * change

    tokencache.SelectSpan(generation, 0, None, 6, gap=torch.ones(2, 6)).scatter(at(0))  # the first full step: nothing before it
    tokencache.SelectSpan(generation, 0, None, 6, gap=torch.full((2, 6), 2.0)).scatter(at(2))  # a full step two steps later
    generation.full = False
    last = torch.full((2, 6), 2.0)  # the step each token was last computed at
    for step, index in ((5, torch.tensor([[1, 4], [0, 5]])), (7, torch.tensor([[2, 4], [0, 3]]))):
        gap = step - last
        age = gap.scatter(1, index, 0.0)
        rows = at(step).gather(1, index[..., None].expand(-1, -1, 8))
        out = tokencache.SelectSpan(generation, 0, index, 6, age, gap).scatter(rows)
        assert torch.allclose(out, at(step), atol=1e-5), step
        last.scatter_(1, index, float(step))


@pytest.mark.parametrize("name", ["flux", "wan", "sd3"])
def test_forecast_keeps_full_steps_exact_and_moves_the_cached_ones(name):
    """With ``forecast`` the full steps stay vanilla's bit for bit and the cached steps differ from holding the
    outputs (a slope per span or residual is kept beside each cache, counted in what describe() reports)."""
    calls = generation(name)
    vanilla = run(name, calls)
    with tokenmerge.patched(model_of(name), **OPTIONS):
        held = run(name, calls)
    with tokenmerge.patched(model_of(name), **OPTIONS, forecast=1.0):
        forecast = run(name, calls)
        (patch,) = [s for _, s in tokenmerge.hooks.states_in([model_of(name)])]
        (slot,) = [g for g in patch.generations().slots if g.outputs]
        assert slot.slopes.keys() == slot.outputs.keys()
    for i in FULL:
        assert torch.equal(forecast[i], vanilla[i])
    for i in CACHED:
        assert not torch.equal(forecast[i], held[i]) and relative(forecast[i], vanilla[i]) < 0.3


@pytest.mark.parametrize("name", ["flux", "wan", "qwen-image"])
def test_each_image_is_independent_of_its_batch(name):
    """Each sample chooses its own tokens from its own changes: image 0 of a batch of two different samples is image
    0 made alone, up to float batching noise."""
    pair, single = generation(name, batch=2), generation(name, batch=1)
    alone = [{k: sample_of(v, one[k], 0) for k, v in both.items()} for both, one in zip(pair, single)]
    with tokenmerge.patched(model_of(name), **OPTIONS):
        batched = run(name, pair)
    with tokenmerge.patched(model_of(name), **OPTIONS):
        single = run(name, alone)
    for i in CACHED:
        assert relative(batched[i][:1], single[i]) < 1e-4


def test_threads_keep_their_own_generations():
    """Two threads running different generations at once give each its sequential result."""
    model, calls = model_of("flux"), {0: generation("flux", seed=0), 1: generation("flux", seed=3)}
    with tokenmerge.patched(model, **OPTIONS):
        sequential = {k: run("flux", c) for k, c in calls.items()}
        found: dict[int, list[torch.Tensor]] = {}
        threads = [threading.Thread(target=lambda k=k: found.__setitem__(k, run("flux", calls[k]))) for k in calls]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for k in calls:
        assert all(torch.equal(a, b) for a, b in zip(found[k], sequential[k]))


@pytest.mark.parametrize(
    "options,named",
    [
        (dict(recompute=0), "recompute"),
        (dict(recompute=1.5), "recompute"),
        (dict(recompute=float("nan")), "recompute"),
        (dict(refresh_every=0), "refresh_every"),
        (dict(refresh_every=2.5), "refresh_every"),
        (dict(full_steps=-1), "full_steps"),
        (dict(cache_dtype="int3"), "cache_dtype"),
        (dict(cache_dtype=torch.float64), "cache_dtype"),
        (dict(memory="tiny"), "memory"),
    ],
)
def test_bad_options_are_refused_by_name(options, named):
    with pytest.raises((ValueError, TypeError), match=named):
        tokenmerge.TokenMergeConfig(method="tokencache", **options)


KEPT = [dict(cache_dtype=None), dict(cache_dtype="int8"), dict(cache_dtype="int4"), dict(cache_dtype="bfloat16")]
KEPT += [dict(cache_dtype=torch.float16), dict(memory="low")]


@pytest.mark.parametrize("kept", KEPT, ids=["exact", "int8", "int4", "bfloat16", "float16", "low"])
def test_every_way_of_keeping_the_caches_acts_and_keeps_full_steps_exact(kept):
    """Every way of keeping the caches: full steps bit-identical to vanilla, cached steps near the exact cache's (on
    this 16-wide model, whose groups are 16 values: the casts within 10 % of the exact cache's own distance from
    vanilla, int8 within 25 %, int4 and memory="low" within 3x), and the bytes held as the dtype says."""
    calls = generation("flux")
    vanilla = run("flux", calls)
    with tokenmerge.patched(model_of("flux"), **OPTIONS, cache_dtype=None):
        exact = run("flux", calls)
    model = model_of("flux")
    with tokenmerge.patched(model, **OPTIONS, **kept):
        (patch,) = [s for _, s in tokenmerge.hooks.states_in([model])]
        outputs = run("flux", calls[:-1])
        held = patch.generations().slots[0]
        outputs += run("flux", calls[-1:])
    for i in FULL:
        assert torch.equal(outputs[i], vanilla[i])
    name = "int4" if kept.get("memory") == "low" else kept["cache_dtype"]
    bound = {None: 0, "bfloat16": 0.1, torch.float16: 0.1, "int8": 0.25, "int4": 3}[name]
    for i in CACHED:
        assert relative(outputs[i], exact[i]) <= bound * relative(exact[i], vanilla[i]) + 1e-6
        assert 0 < relative(outputs[i], vanilla[i]) < 0.3
    found = sum(t.nbytes for t in [*held.outputs.values(), *(s for k, v, _ in held.keys.values() for s in (k, v))])
    whole = sum(t.read(torch.float32).numel() * 4 for t in [*held.outputs.values(), *(s for k, v, _ in held.keys.values() for s in (k, v))])
    expected = {None: 1, "bfloat16": 0.5, torch.float16: 0.5, "int8": 0.32, "int4": 0.19}[name]  # of float32 (keys: groups of 8)
    assert found <= expected * whole


def test_memory_low_keeps_the_cache_as_int4_and_refuses_another_cache_dtype():
    assert tokencache.kept_as(tokenmerge.TokenMergeConfig(method="tokencache", memory="low")) == "int4"
    with pytest.raises(ValueError, match="memory='low' keeps the token cache as int4; cache_dtype='bfloat16'"):
        tokenmerge.TokenMergeConfig(method="tokencache", memory="low", cache_dtype="bfloat16")


def test_options_it_does_not_read_are_said(recwarn):
    with tokenmerge.patched(model_of("flux"), method="tokencache", ratio=0.3):
        pass
    assert any("does not use ratio=0.3" in str(w.message) for w in recwarn)


def test_describe_says_what_it_caches_and_how_much_it_holds():
    model = model_of("flux")
    with tokenmerge.patched(model, **OPTIONS):
        before = str(tokenmerge.describe(model, (8, 8)))
        run("flux", generation("flux", calls=2))
        after = str(tokenmerge.describe(model, (8, 8)))
    assert "1 token in 4 recomputed (16 of 64, 8x8)" in before and "nothing held in this thread" in before
    assert "MiB held in this thread on cpu (1 guidance slot(s), batch 2): span outputs" in after
    assert "MiB as int8, block inputs" in after


def test_a_step_cache_skips_steps_without_advancing_or_poisoning_the_token_cache():
    """FirstBlockCache decides by its first block, which the token cache leaves whole (said once); the steps it skips
    record nothing and do not count toward the token cache's full steps. The whole loop stays near FirstBlockCache
    alone."""
    from diffusers import FirstBlockCacheConfig

    model = build_model("flux", small=True)
    inputs = transformer_inputs(model, "flux", 16, 16, batch=1, text_tokens=5)
    cached_alone = flow_loop(model, "flux", inputs, Clock(8))
    model.enable_cache(FirstBlockCacheConfig(threshold=0.2))
    try:
        fbcache = flow_loop(model, "flux", inputs, Clock(8))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with tokenmerge.patched(model, **OPTIONS):
                both = flow_loop(model, "flux", inputs, Clock(8))
    finally:
        model.disable_cache()
    notices = [str(w.message) for w in caught if "decides by the output of" in str(w.message)]
    assert len(notices) == 1 and "tokencache leaves them whole" in notices[0]
    assert relative(both, fbcache) < 0.05 and relative(fbcache, cached_alone) < 0.05


def test_a_diffusers_unet_and_an_ldm_unet_cache_their_transformer_blocks():
    unet = build_model("sd15", small=True)
    from tokenmerge.tools.architectures import unet_inputs

    base = unet_inputs(unet, 64, 64, batch=2)
    calls = [
        {**base, "timestep": torch.tensor(t), "sample": base["sample"] * (1 - 0.03 * i)}
        for i, t in enumerate((999, 800, 600, 400, 200, 100))
    ]
    with torch.no_grad():
        vanilla = [unet(**c).sample for c in calls]
        with tokenmerge.patched(unet, **OPTIONS):
            outputs = [unet(**c).sample for c in calls]
    assert all(torch.equal(outputs[i], vanilla[i]) for i in FULL)
    assert all(0 < relative(outputs[i], vanilla[i]) < 0.2 for i in CACHED)

    ldm = build_ldm_unet()
    x, _, context = ldm_inputs(8, 8)
    steps = [(x * (1 - 0.03 * i), torch.full((2,), t), context) for i, t in enumerate((999.0, 800.0, 600.0, 400.0, 200.0, 100.0))]
    with torch.no_grad():
        vanilla = [ldm(*s) for s in steps]
        with tokenmerge.patched(ldm, **OPTIONS):
            outputs = [ldm(*s) for s in steps]
    assert all(torch.equal(outputs[i], vanilla[i]) for i in FULL)
    assert all(0 < relative(outputs[i], vanilla[i]) < 0.2 for i in CACHED)
