"""tokenmerge next to the accelerators users combine it with: DeepCache, FreeU, attention slicing, and diffusers'
caching hooks (Pyramid Attention Broadcast), which tome refuses where they would scramble merged outputs."""

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


@pytest.mark.parametrize("order", ["pab-first", "tokenmerge-first"])
def test_pyramid_attention_broadcast_is_refused_with_tome_and_works_with_todo(order):
    unet = build_unet("sd15", small=True)
    current = {"t": 500}
    inputs = sd_inputs(unet, 16, 16)
    if order == "pab-first":
        _pab(unet, current)
    tokenmerge.apply_patch(unet, ratio=0.5)
    if order == "tokenmerge-first":
        _pab(unet, current)
    with (
        torch.no_grad(),
        pytest.raises(RuntimeError, match="pyramid_attention_broadcast hook, which returns outputs cached in earlier steps"),
    ):
        unet(**inputs)
    tokenmerge.apply_patch(unet, method="todo", kv_factor=2)
    outputs = []
    with torch.no_grad():
        for t in (500, 400, 300):  # PAB computes, skips (reuses attn1's output), computes
            current["t"] = t
            outputs.append(unet(**{**inputs, "timestep": torch.tensor(t)}).sample)
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
def test_caches_inside_flux_single_stream_blocks_are_refused_with_tome_and_quiet_with_todo(cache):
    """An attention cache on Flux's single-stream attention sits inside the norm -> proj_out merged span: with tome
    its replayed output would be unmerged with another step's plan, so it is refused (found through diffusers' hook
    registry); with todo it composes, and a replayed step (no attention run) is no reason to warn."""
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

    with tokenmerge.patched(model, ratio=0.5), pytest.raises(RuntimeError, match="returns outputs cached in earlier steps"):
        steps()
    model = build_model("flux", small=True)  # a fresh cache: the refused call stopped it mid-step
    cache(model)
    with tokenmerge.patched(model, method="todo"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        steps()
    assert not [w for w in caught if "were not downsampled" in str(w.message)]
