"""The webui path: its exact tomesd call sequence on ldm (SD 1.x) and sgm-style (SDXL) models, and the extension."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

import tokenmerge
from conftest import attn1_token_counts, build_ldm_unet, ldm_inputs
from sgm_standin import build_sgm_sdxl_unet


def webui_object(unet: torch.nn.Module) -> torch.nn.Module:
    """What the webui passes: the LatentDiffusion / DiffusionEngine object, with .model.diffusion_model."""
    sd_model = torch.nn.Module()
    sd_model.model = torch.nn.Module()
    sd_model.model.diffusion_model = unet
    return sd_model


def apply_token_merging(tomesd, sd_model, token_merging_ratio):
    """The webui's modules/sd_models.apply_token_merging call sequence (A1111 1.x)."""
    current = getattr(sd_model, "applied_token_merged_ratio", 0)
    if current == token_merging_ratio:
        return
    if current > 0:
        tomesd.remove_patch(sd_model)
    if token_merging_ratio > 0:
        tomesd.apply_patch(sd_model, ratio=token_merging_ratio, use_rand=False, merge_attn=True, merge_crossattn=False, merge_mlp=False)
    sd_model.applied_token_merged_ratio = token_merging_ratio


def _run(unet, x, t, context, **kwargs):
    with torch.no_grad():
        return unet(x, t, context=context, **kwargs)


@pytest.mark.parametrize("family", ["ldm_sd15", "sgm_sdxl"])
def test_webui_call_sequence_first_pass_hires_pass_and_removal(family):
    unet = build_ldm_unet(small=True) if family == "ldm_sd15" else build_sgm_sdxl_unet()
    sd_model = webui_object(unet)
    x, t, context = ldm_inputs(16, 16)
    hires = ldm_inputs(24, 24)
    vanilla, vanilla_hires = _run(unet, x, t, context), _run(unet, *hires)

    apply_token_merging(tokenmerge, sd_model, 0.5)  # first pass
    with attn1_token_counts(unet) as counts:
        first = _run(unet, x, t, context)
    apply_token_merging(tokenmerge, sd_model, 0.3)  # hires pass with another ratio: remove + apply
    hires_out = _run(unet, *hires)
    apply_token_merging(tokenmerge, sd_model, 0)  # token merging off again
    assert torch.equal(_run(unet, x, t, context), vanilla)
    assert torch.equal(_run(unet, *hires), vanilla_hires)

    top = 128 if family == "ldm_sd15" else 32  # SDXL: level 2 (8x8 tokens) is the highest with attention
    assert top in counts and 2 * top not in counts
    for out, reference, ratio, inputs in ((first, vanilla, 0.5, (x, t, context)), (hires_out, vanilla_hires, 0.3, hires)):
        assert torch.isfinite(out).all() and not torch.equal(out, reference)
        tokenmerge.apply_patch(sd_model, ratio=ratio, use_rand=False)
        assert torch.equal(_run(unet, *inputs), out)  # each pass ran exactly with its own ratio
        tokenmerge.remove_patch(sd_model)


def test_sgm_additional_tokens_pass_through_merged_attention():
    """sgm's attention prepends additional tokens to the (merged) sequence and cuts them off again."""
    unet = build_sgm_sdxl_unet()
    container = next(m for m in unet.modules() if type(m).__name__ == "SpatialTransformer")
    block = container.transformer_blocks[0]
    dim = block.norm1.normalized_shape[0]
    tokenmerge.apply_patch(webui_object(unet), ratio=0.5)
    g = torch.Generator().manual_seed(0)
    tokens, extra, context = torch.randn(2, 64, dim, generator=g), torch.randn(2, 3, dim, generator=g), torch.randn(2, 5, 32, generator=g)
    with torch.no_grad(), attn1_token_counts(container) as counts:
        for hook in container._forward_pre_hooks.values():  # the container's grid hook, as its forward would run it
            hook(container, (torch.randn(2, dim, 8, 8),), {})
        out = block(tokens, context=context, additional_tokens=extra)
    tokenmerge.remove_patch(unet)
    assert counts == [32]  # attn1 received the merged 8x8 grid; the extra tokens are added inside attention
    assert out.shape == tokens.shape and torch.isfinite(out).all()


@pytest.fixture
def webui_modules(monkeypatch):
    """The three webui modules the extension script touches, as minimal stand-ins (the webui is not on PyPI)."""
    settings_callbacks = []
    opts = types.SimpleNamespace(added={})

    def add_option(key, info):
        opts.added[key] = info
        setattr(opts, key, info.default)

    opts.add_option = add_option
    shared = types.SimpleNamespace(opts=opts, OptionInfo=lambda default, label, section=None: types.SimpleNamespace(default=default, label=label, section=section))
    script_callbacks = types.SimpleNamespace(on_ui_settings=settings_callbacks.append)
    sd_models = types.SimpleNamespace(tomesd=None)
    modules = types.ModuleType("modules")
    modules.shared, modules.script_callbacks, modules.sd_models = shared, script_callbacks, sd_models
    for name, module in {"modules": modules, "modules.shared": shared, "modules.script_callbacks": script_callbacks, "modules.sd_models": sd_models}.items():
        monkeypatch.setitem(sys.modules, name, module)
    return types.SimpleNamespace(shared=shared, sd_models=sd_models, settings_callbacks=settings_callbacks)


def test_extension_replaces_tomesd_and_adds_its_settings(webui_modules):
    path = Path(__file__).parents[1] / "webui_tokenmerge" / "scripts" / "tokenmerge_webui.py"
    spec = importlib.util.spec_from_file_location("tokenmerge_webui_script", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))

    for callback in webui_modules.settings_callbacks:
        callback()
    opts = webui_modules.shared.opts
    assert set(opts.added) == {f"tokenmerge_{name}" for name in ("method", "kv_factor", "use_rand", "seed", "merge_crossattn")}
    shim = webui_modules.sd_models.tomesd
    assert shim is not None

    unet = build_ldm_unet(small=True)
    sd_model = webui_object(unet)
    x, t, context = ldm_inputs(16, 16)
    apply_token_merging(shim, sd_model, 0.5)
    assert tokenmerge.get_config(sd_model).use_rand is False  # the webui's own request, honoured by default
    apply_token_merging(shim, sd_model, 0)
    opts.tokenmerge_use_rand, opts.tokenmerge_seed = True, 7
    apply_token_merging(shim, sd_model, 0.5)
    config = tokenmerge.get_config(sd_model)
    assert config.use_rand is True and config.seed == 7 and config.ratio == 0.5
    first = _run(unet, x, t, context)
    assert torch.equal(_run(unet, x, t, context), first)  # deterministic, so safe with every sampler
    apply_token_merging(shim, sd_model, 0)
    assert tokenmerge.get_config(sd_model) is None
    opts.tokenmerge_method = "todo"
    apply_token_merging(shim, sd_model, 0.5)
    assert tokenmerge.get_config(sd_model).method == "todo"
    assert not torch.equal(_run(unet, x, t, context), first)
    apply_token_merging(shim, sd_model, 0)
