"""tokenmerge next to the accelerators users combine it with: DeepCache, FreeU, attention slicing, and diffusers'
caching hooks (Pyramid Attention Broadcast, TaylorSeer), whose cached spans tome runs unmerged where replaying
merged outputs would scramble them."""

from __future__ import annotations

import pytest
import torch

import tokenmerge
from tokenmerge.tools.architectures import build_unet
from tokenmerge.tools.pipelines import enable, latent_pipeline, sample_latents

from conftest import sd_inputs


@pytest.fixture(scope="module")
def pipe():
    return latent_pipeline(build_unet("sd15", small=True))


def _sample(pipe, steps=4):
    return sample_latents(pipe, 128, steps)


@pytest.mark.parametrize("accelerator", ["deepcache", "freeu", "slicing"])
@pytest.mark.parametrize("first", ["tokenmerge", "accelerator"])
def test_accelerators_compose_with_tokenmerge(pipe, accelerator, first):
    pytest.importorskip("DeepCache") if accelerator == "deepcache" else None
    vanilla = _sample(pipe)
    with tokenmerge.patched(pipe, ratio=0.5):
        merged = _sample(pipe)
    off = enable(pipe, accelerator)
    try:
        alone = _sample(pipe)
        if first == "tokenmerge":
            off()
            tokenmerge.apply_patch(pipe, ratio=0.5)
            off = enable(pipe, accelerator)
        else:
            tokenmerge.apply_patch(pipe, ratio=0.0)
            assert torch.equal(_sample(pipe), alone)  # ratio 0 leaves the accelerator's result alone
            tokenmerge.update_options(pipe, ratio=0.5)
        both = _sample(pipe)
        assert torch.equal(_sample(pipe), both)  # deterministic together
    finally:
        off()
        tokenmerge.remove_patch(pipe)
    assert torch.isfinite(both).all()
    if accelerator == "slicing":  # slicing changes no result: tokenmerge with it equals tokenmerge alone
        torch.testing.assert_close(both, merged, rtol=1e-3, atol=1e-3)
    else:
        assert not torch.equal(both, alone) and not torch.equal(both, merged)
    assert torch.equal(_sample(pipe), vanilla)  # both removed: vanilla again


def test_an_sdxl_pipeline_runs_deepcache_with_tokenmerge():
    """The bench's latent pipeline around an SDXL UNet (its added conditioning built from random pooled embeddings):
    DeepCache and tokenmerge each change the loop, together deterministically, and removed leave vanilla's."""
    pytest.importorskip("DeepCache")
    sdxl = latent_pipeline(build_unet("sdxl", small=True))
    assert type(sdxl).__name__ == "StableDiffusionXLPipeline"
    vanilla = _sample(sdxl)
    off = enable(sdxl, "deepcache")
    try:
        alone = _sample(sdxl)
        with tokenmerge.patched(sdxl, ratio=0.5):
            both = _sample(sdxl)
            assert torch.equal(_sample(sdxl), both)
    finally:
        off()
    assert torch.isfinite(both).all() and not torch.equal(alone, vanilla) and not torch.equal(both, alone)
    assert torch.equal(_sample(sdxl), vanilla)


def _pab(unet, current):
    from diffusers import PyramidAttentionBroadcastConfig, apply_pyramid_attention_broadcast

    config = PyramidAttentionBroadcastConfig(
        spatial_attention_block_skip_range=2,
        spatial_attention_timestep_skip_range=(100, 800),
        current_timestep_callback=lambda: current["t"],
    )
    apply_pyramid_attention_broadcast(unet, config)


def _remove_pab(unet):
    for module in unet.modules():
        registry = getattr(module, "_diffusers_hook", None)
        if registry is not None:
            for name in list(registry.hooks):
                registry.remove_hook(name, recurse=False)


def _pab_steps(unet, current, inputs):
    outputs = []
    with torch.no_grad():
        for t in (500, 400, 300):  # PAB computes, skips (reuses attn1's output), computes
            current["t"] = t
            outputs.append(unet(**{**inputs, "timestep": torch.tensor(t)}).sample)
    return outputs


@pytest.mark.parametrize("order", ["pab-first", "tokenmerge-first"])
def test_pyramid_attention_broadcast_with_tome_runs_its_spans_unmerged_and_works_with_todo(order):
    """PAB replays attn1's output of an earlier step: with tome, attn1's span runs unmerged (said once for the whole
    UNet, not per block), so the result is PAB's own where tome merges nothing else; the other spans still merge."""
    import warnings

    unet = build_unet("sd15", small=True)
    current = {"t": 500}
    inputs = sd_inputs(unet, 16, 16)
    _pab(unet, current)
    with_pab = _pab_steps(unet, current, inputs)
    _remove_pab(unet)
    if order == "pab-first":
        _pab(unet, current)
    tokenmerge.apply_patch(unet, ratio=0.5)
    if order == "tokenmerge-first":
        _pab(unet, current)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tome_and_pab = _pab_steps(unet, current, inputs)
    notices = [str(w.message) for w in caught if "pyramid_attention_broadcast" in str(w.message)]
    assert len(notices) == 1 and "runs unmerged" in notices[0], notices
    assert all(torch.equal(a, b) for a, b in zip(tome_and_pab, with_pab))  # attn1 was tome's only merged span
    tokenmerge.update_options(unet, ratio=0.5, merge_mlp=True)
    seen = []
    ff = next(m for name, m in unet.named_modules() if name.endswith("transformer_blocks.0.ff"))
    handle = ff.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[1]))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            merged_mlp = _pab_steps(unet, current, inputs)
    finally:
        handle.remove()
    assert min(seen) < max(seen) or min(seen) < 256  # the feed-forward span still runs on merged tokens
    assert all(torch.isfinite(o).all() for o in merged_mlp) and not torch.equal(merged_mlp[0], with_pab[0])
    tokenmerge.apply_patch(unet, method="todo", kv_factor=2)
    outputs = _pab_steps(unet, current, inputs)
    _remove_pab(unet)
    with torch.no_grad():
        current["t"] = 500
        todo_alone = unet(**inputs).sample
    tokenmerge.remove_patch(unet)
    assert torch.equal(outputs[0], todo_alone)  # the steps PAB computes are tokenmerge's own result
    assert all(torch.isfinite(o).all() for o in outputs)


def _flux_pab(model):
    from diffusers import PyramidAttentionBroadcastConfig, apply_pyramid_attention_broadcast

    config = PyramidAttentionBroadcastConfig(
        spatial_attention_block_skip_range=2,
        spatial_attention_timestep_skip_range=(-1, 1001),
        spatial_attention_block_identifiers=("single_transformer_blocks",),
        current_timestep_callback=lambda: 500,
    )
    apply_pyramid_attention_broadcast(model, config)


def _flux_taylorseer(model):
    from diffusers import TaylorSeerCacheConfig

    model.enable_cache(
        TaylorSeerCacheConfig(
            cache_interval=2,
            disable_cache_before_step=1,
            taylor_factors_dtype=torch.float32,
            cache_identifiers=[r"single_transformer_blocks\.\d+\.attn"],
        )
    )


@pytest.mark.parametrize("cache", [_flux_pab, _flux_taylorseer], ids=["pab-single-stream", "taylorseer"])
def test_caches_inside_flux_single_stream_blocks_run_unmerged_with_tome_and_quiet_with_todo(cache):
    """An attention cache on Flux's single-stream attention sits inside the norm -> proj_out merged span: with tome
    its replayed output would be unmerged with another step's plan, so that span runs unmerged (found through
    diffusers' hook registry; said once); with todo it composes, and a replayed step (no attention run) is no reason
    to warn."""
    import warnings

    from tokenmerge.tools.architectures import build_model, transformer_inputs

    model = build_model("flux", small=True)
    try:
        cache(model)
    except (ImportError, TypeError) as error:  # this diffusers has no such cache or takes other options
        pytest.skip(f"cache not available: {error}")
    inputs = transformer_inputs(model, "flux", 16, 16, text_tokens=5)

    def steps() -> None:
        with torch.no_grad(), model.cache_context("cond"):
            for _ in range(4):
                model(**inputs)

    seen = []
    attention = model.single_transformer_blocks[0].attn
    handle = attention.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["hidden_states"].shape[1]), with_kwargs=True
    )
    with tokenmerge.patched(model, ratio=0.5), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        steps()
    handle.remove()
    notices = [str(w.message) for w in caught if "returns outputs cached in earlier steps" in str(w.message)]
    assert len(notices) == 1 and "runs unmerged" in notices[0], notices
    assert seen and set(seen) == {16 * 16 // 4 + 5}  # every token of the single stream (image + text) reached it
    model = build_model("flux", small=True)  # a fresh cache
    cache(model)
    with tokenmerge.patched(model, method="todo"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        steps()
    assert not [w for w in caught if "were not downsampled" in str(w.message)]
