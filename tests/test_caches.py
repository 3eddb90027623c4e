"""tokenmerge stacked on the step caches users pick first for DiTs, in whole flow-matching loops of a (small) Flux.1:
diffusers' FirstBlockCache, TaylorSeer, MagCache, FasterCache and PyramidAttentionBroadcast, and cache-dit's DBCache
(:mod:`tokenmerge.tools.caches`). Per cache: identity options leave the cache's own result bit-identical; every
method composes (deterministic, finite, in either order of enabling); turning both off restores vanilla exactly;
and cache-dit leaves nothing behind that would break the next cache. The reference models' eval runs them too."""

from __future__ import annotations

import warnings

import pytest
import torch

import tokenmerge
from tokenmerge.tools.architectures import build_model, transformer_inputs
from tokenmerge.tools.caches import CACHES, Clock, enable_cache
from tokenmerge.tools.loops import flow_loop
from tokenmerge.tools.specs import PatchSpec

pytest.importorskip("cache_dit")


@pytest.fixture(scope="module")
def flux():
    model = build_model("flux", small=True)
    inputs = transformer_inputs(model, "flux", 32, 32, batch=1, text_tokens=8)
    clock = Clock(8)
    return model, inputs, clock, flow_loop(model, "flux", inputs, clock)


def _loop(flux, spec: str) -> torch.Tensor:
    model, inputs, clock, _ = flux
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with PatchSpec.parse(spec).applied(model, clock=clock, seed=0):
            return flow_loop(model, "flux", inputs, clock)


@pytest.mark.parametrize("cache", CACHES)
def test_identity_options_leave_each_cache_bit_identical(flux, cache):
    alone = _loop(flux, cache)
    assert torch.equal(_loop(flux, f"todo:1+{cache}"), alone)
    assert torch.equal(_loop(flux, f"tome:0+{cache}"), alone)


@pytest.mark.parametrize("method", ["tome:0.5", "todo:2", "auto,auto_min_tokens=16,auto_max_keys=16"])
@pytest.mark.parametrize("cache", CACHES)
def test_every_method_composes_with_each_cache_and_both_remove_cleanly(flux, cache, method):
    model, inputs, clock, vanilla = flux
    both = _loop(flux, f"{method}+{cache}")
    assert torch.isfinite(both).all() and not torch.equal(both, vanilla)
    assert torch.equal(_loop(flux, f"{method}+{cache}"), both)  # deterministic, loop after loop
    off = enable_cache(model, cache, clock)  # the other order: the cache first, then tokenmerge
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with PatchSpec.parse(method).applied(model, seed=0):
                other_order = flow_loop(model, "flux", inputs, clock)
    finally:
        off()
    assert torch.equal(other_order, both)
    assert torch.equal(flow_loop(model, "flux", inputs, clock), vanilla)  # nothing of either left behind


def test_the_caches_skip_work_and_cache_dit_leaves_nothing_for_the_next_one(flux):
    """Each cache skips some attention calls of the loop (DBCache on its fixed steps mask: the first block of 3 on
    its 3 cached steps of 8); after cache-dit is turned off, FirstBlockCache (which takes the first child list's
    first block as its head) gives what it gives on a model cache-dit never touched."""
    model, inputs, clock, _ = flux
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return sdpa(*args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = counted
    try:
        counts = {}
        for cache in ("none", *CACHES):
            calls.clear()
            _loop(flux, cache) if cache != "none" else flow_loop(model, "flux", inputs, clock)
            counts[cache] = len(calls)
    finally:
        torch.nn.functional.scaled_dot_product_attention = sdpa
    blocks = len(model.transformer_blocks) + len(model.single_transformer_blocks)
    assert counts["none"] == blocks * clock.steps
    assert counts["dbcache"] == counts["dbcache-nocal"] == counts["none"] - 3 * (blocks - 1)
    assert all(counts[c] < counts["none"] for c in CACHES if c != "fbcache")  # fbcache decides by its threshold
    fresh = build_model("flux", small=True)
    _loop(flux, "dbcache")
    after_cache_dit = _loop(flux, "fbcache")
    with PatchSpec.parse("fbcache").applied(fresh, clock=clock):
        assert torch.equal(flow_loop(fresh, "flux", inputs, clock), after_cache_dit)


def test_a_cache_on_a_unet_is_refused_with_the_one_that_fits():
    unet = build_model("sd15", small=True)
    with pytest.raises(ValueError, match=r"a UNet's is \+deepcache"):
        enable_cache(unet, "fbcache", Clock(4))


@pytest.mark.parametrize("kind,configs", [("flux", ["fbcache", "auto+dbcache"]), ("unet", ["deepcache", "tome:0.5+deepcache"])])
def test_eval_runs_the_caches_on_the_reference_models(kind, configs):
    from tokenmerge.tools.evaluate import make_sampler, run_eval

    sampler = make_sampler(kind, None, 6, 3.0)
    specs = [PatchSpec.parse(c) for c in configs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results, _ = run_eval(specs, [0], sampler, sampler.target)
    by_name = {r.name: r for r in results}
    for spec in specs:
        psnr = by_name[spec.name].psnr[0]
        assert psnr > 5  # a sample of the same scene, not noise (inf where a threshold cache never fired)
    for module in sampler.target.modules():  # no wrapper left (diffusers' hooks leave the class's own forward bound)
        forward = vars(module).get("forward")
        assert forward is None or getattr(forward, "__func__", None) is type(module).forward
    assert tokenmerge.get_config(sampler.target) is None  # and the patch


def _enable_deciding(model: torch.nn.Module, cache: str, first: int) -> None:
    if cache == "fbcache":
        from diffusers import FirstBlockCacheConfig

        model.enable_cache(FirstBlockCacheConfig(threshold=0.08))
        return
    import cache_dit
    from cache_dit import DBCacheConfig

    # cache-dit's own setting (a residual threshold decides after the warm-up) with its first `first` blocks deciding;
    # "static": its steps mask decides alone, no block's output is compared
    masked = {"steps_computation_mask": cache_dit.steps_mask(total_steps=8, mask_policy="fast"), "steps_computation_policy": "static"}
    config = DBCacheConfig(Fn_compute_blocks=first, Bn_compute_blocks=0, max_warmup_steps=2, **(masked if cache == "static" else {}))
    cache_dit.enable_cache(model, cache_config=config)


@pytest.mark.parametrize(
    "family,cache,first,deciding",
    [("flux", "fbcache", 0, [0]), ("flux", "dbcache", 2, [0, 1]), ("flux", "static", 2, []), ("chroma", "dbcache", 1, [0, 1])],
    ids=["fbcache", "dbcache", "static", "dbcache-per-list"],
)
def test_tome_leaves_the_blocks_a_cache_decides_by_unmerged(family, cache, first, deciding):
    """FirstBlockCache (its head block) and DBCache with a threshold (the first Fn blocks of each list it caches:
    Flux's lists joined into one, Chroma's two with a cache context each) compare a block's output across steps to
    decide whether to run the rest; merged, that output carries ToMe's error, which moves from step to step by more
    than the threshold, and the cache would reuse no step (the reference model: docs/stacking.md). Those blocks run
    unmerged (said once), the others merged; under a static steps mask nothing is compared."""
    model = build_model(family, small=True)
    _enable_deciding(model, cache, first)
    inputs = transformer_inputs(model, family, 16, 16, batch=1, text_tokens=5)
    blocks = [*model.transformer_blocks, *model.single_transformer_blocks]
    seen: dict[int, set[int]] = {i: set() for i in range(len(blocks))}
    with tokenmerge.patched(model, ratio=0.5), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handles = [  # after the patch's own hooks: what each attention is handed
            b.attn.register_forward_pre_hook(lambda m, args, kwargs, i=i: seen[i].add(kwargs["hidden_states"].shape[1]), with_kwargs=True)
            for i, b in enumerate(blocks)
        ]
        flow_loop(model, family, inputs, Clock(4))
    for handle in handles:
        handle.remove()
    full = {i: 16 * 16 // 4 + (5 if i >= len(model.transformer_blocks) else 0) for i in seen}  # single stream: + text
    assert [i for i in seen if seen[i] == {full[i]}] == deciding
    assert all(max(seen[i]) < full[i] for i in seen if i not in deciding)
    notices = [str(w.message) for w in caught if "decides by the output of" in str(w.message)]
    assert len(notices) == (1 if deciding else 0) and all("tome leaves them whole" in n for n in notices), notices


@pytest.mark.parametrize("cache,method", [("dbcache", "tome"), ("dbcache-nocal", "tome"), ("dbcache", "auto")])
def test_tome_under_a_forecasting_calibrator_is_said_once(cache, method):
    """cache-dit's TaylorSeer calibrator forecasts the cached residual from its change between computed steps, which
    under tome holds ToMe's per-step error (the reference model: 2.3 dB below ToMe r=0.5 alone, docs/stacking.md): the
    combination runs and is said once; without the calibrator, or with auto, nothing is said."""
    model = build_model("flux", small=True)
    inputs = transformer_inputs(model, "flux", 16, 16, batch=1, text_tokens=5)
    clock = Clock(4)
    spec = f"{'tome:0.5' if method == 'tome' else 'auto,auto_min_tokens=16'}+{cache}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with PatchSpec.parse(spec).applied(model, clock=clock, seed=0):
            out = flow_loop(model, "flux", inputs, clock)
    assert torch.isfinite(out).all()
    notices = [w for w in caught if "calibrator forecasts" in str(w.message)]
    assert len(notices) == (1 if (cache, method) == ("dbcache", "tome") else 0), notices
    assert all("calibrator_config=None" in str(w.message) and w.filename == __file__ for w in notices)
