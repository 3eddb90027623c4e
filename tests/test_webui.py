"""The webui path: its exact tomesd call sequence on ldm (SD 1.x) and sgm-style (SDXL) models, and the extension."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

import tokenmerge
from tokenmerge.config import OPTION_NAMES

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
    g = torch.Generator().manual_seed(0)

    def add_tokens(block, args, kwargs):  # as a model that uses sgm's additional_tokens passes them
        x = args[0] if args else kwargs["x"]
        return args, {**kwargs, "additional_tokens": torch.randn(x.shape[0], 3, x.shape[-1], generator=g)}

    handles = [
        m.register_forward_pre_hook(add_tokens, with_kwargs=True) for m in unet.modules() if type(m).__name__ == "BasicTransformerBlock"
    ]
    x, t, context = ldm_inputs(16, 16)
    try:
        with tokenmerge.patched(webui_object(unet), ratio=0.5), attn1_token_counts(unet) as counts:
            out = _run(unet, x, t, context)
    finally:
        for h in handles:
            h.remove()
    assert 32 in counts and 64 not in counts  # attn1 received the merged 8x8 grid; the extra tokens are added inside
    assert out.shape == x.shape and torch.isfinite(out).all()


@pytest.fixture
def webui_modules(monkeypatch):
    """The webui modules the extension script touches, as minimal stand-ins (the webui is not on PyPI):
    ``modules.shared`` (opts, OptionInfo with the webui's signature), ``modules.script_callbacks``,
    ``modules.sd_models`` (A1111's has a ``tomesd`` attribute; Forge's has none) and ``gradio``'s components."""
    settings_callbacks = []
    opts = types.SimpleNamespace(added={})

    def add_option(key, info):
        opts.added[key] = info
        setattr(opts, key, info.default)

    def option_info(default=None, label="", component=None, component_args=None, onchange=None, section=None, **kwargs):
        return types.SimpleNamespace(default=default, label=label, component=component, component_args=component_args, section=section)

    opts.add_option = add_option
    shared = types.SimpleNamespace(opts=opts, OptionInfo=option_info)
    script_callbacks = types.SimpleNamespace(on_ui_settings=settings_callbacks.append)
    sd_models = types.SimpleNamespace(tomesd=None)
    gradio = types.ModuleType("gradio")
    for component in ("Radio", "Dropdown", "Slider", "Checkbox", "Number"):
        setattr(gradio, component, type(component, (), {}))
    modules = types.ModuleType("modules")
    modules.shared, modules.script_callbacks, modules.sd_models = shared, script_callbacks, sd_models
    for name, module in {
        "modules": modules,
        "modules.shared": shared,
        "modules.script_callbacks": script_callbacks,
        "modules.sd_models": sd_models,
        "gradio": gradio,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    return types.SimpleNamespace(shared=shared, sd_models=sd_models, modules=modules, settings_callbacks=settings_callbacks, gradio=gradio)


def _run_extension_script():
    """What the webui does with an extension's scripts/*.py: execute it under its file name."""
    path = Path(__file__).parents[1] / "scripts" / "tokenmerge_webui.py"
    spec = importlib.util.spec_from_file_location(path.name, path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_extension_replaces_tomesd_and_adds_its_settings_as_choices(webui_modules):
    _run_extension_script()
    for callback in webui_modules.settings_callbacks:
        callback()
    opts = webui_modules.shared.opts
    assert set(opts.added) == {f"tokenmerge_{name}" for name in OPTION_NAMES if name != "ratio"}  # every option; ratio: the webui's
    assert opts.added["tokenmerge_cache_dtype"].component_args["choices"] == ["model", "int8", "int4", "bfloat16", "float16", "float32"]
    method = opts.added["tokenmerge_method"]
    assert method.component is webui_modules.gradio.Radio and method.component_args["choices"] == ["tome", "todo", "auto", "tokencache"]
    assert opts.added["tokenmerge_kv_interpolation"].component is webui_modules.gradio.Dropdown
    shim = webui_modules.sd_models.tomesd
    assert shim is not None

    unet = build_ldm_unet(small=True)
    sd_model = webui_object(unet)
    x, t, context = ldm_inputs(16, 16)
    apply_token_merging(shim, sd_model, 0.5)
    assert tokenmerge.get_config(sd_model).use_rand is False  # the webui's own request, honoured by default
    apply_token_merging(shim, sd_model, 0)
    opts.tokenmerge_use_rand, opts.tokenmerge_seed = True, 7.0  # gradio's Number gives floats
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


def test_extension_routes_forges_token_merging_through_tokenmerge(webui_modules, monkeypatch):
    from tokenmerge.tools.comfy_models import build_comfy_patcher

    import forge_standin

    del webui_modules.sd_models.tomesd  # Forge's sd_models has no tomesd
    forge_tomesd = forge_standin.install_modules(monkeypatch)
    _run_extension_script()
    assert forge_tomesd.TomePatcher is not forge_standin.TomePatcher

    sd_model = forge_standin.sd_model_for(build_comfy_patcher("sd15-small"))
    g = torch.Generator().manual_seed(0)
    x, context = torch.randn(2, 4, 16, 16, generator=g), torch.randn(2, 7, 32, generator=g)
    vanilla = forge_standin.sample(sd_model.forge_objects.unet, x, context)
    seen = []
    record = lambda n, c, v, extra: (seen.append((n.shape[1], c.shape[1])), (n, c, v))[1]  # noqa: E731
    for method, expected in (("tome", (128, 128)), ("todo", (256, 64))):
        webui_modules.shared.opts.tokenmerge_method = method
        sd_model.forge_objects = sd_model.forge_objects_after_applying_lora.shallow_copy()  # as Forge does per pass
        forge_standin.apply_token_merging(sd_model, 0.5)
        patched = sd_model.forge_objects.unet
        assert isinstance(patched, forge_standin.UnetPatcher) and patched is not sd_model.forge_objects_after_applying_lora.unet
        patched.set_model_attn1_patch(record)
        seen.clear()
        out = forge_standin.sample(patched, x, context)
        assert expected in seen  # tome: queries, keys and values merged; todo: keys/values downsampled
        assert torch.isfinite(out).all() and not torch.equal(out, vanilla)
    assert torch.equal(forge_standin.sample(sd_model.forge_objects_after_applying_lora.unet, x, context), vanilla)

    webui_modules.shared.opts.tokenmerge_method = "tokencache"  # Forge's patch points are around attention only: refused
    sd_model.forge_objects = sd_model.forge_objects_after_applying_lora.shallow_copy()
    with pytest.warns(UserWarning, match="method='tokencache' does not run on Forge: .* patch points around attention only"):
        forge_standin.apply_token_merging(sd_model, 0.5)
    assert torch.equal(forge_standin.sample(sd_model.forge_objects.unet, x, context), vanilla)


def test_extension_warns_where_neither_webui_route_exists(webui_modules):
    del webui_modules.sd_models.tomesd
    with pytest.warns(UserWarning, match="neither modules.sd_models.tomesd .* nor backend.misc.tomesd.TomePatcher"):
        _run_extension_script()


def test_forge_with_a_model_tokenmerge_cannot_patch_generates_unchanged(webui_modules, monkeypatch):
    """Forge calls the token-merging patcher without error handling: a Flux model (no UNet patch points) must come
    back unchanged with one warning, never abort the generation."""
    import warnings

    import forge_standin

    del webui_modules.sd_models.tomesd
    forge_standin.install_modules(monkeypatch)
    _run_extension_script()
    flux_like = forge_standin.UnetPatcher(types.SimpleNamespace(diffusion_model=torch.nn.Linear(2, 2)), "cpu", "cpu")
    sd_model = forge_standin.sd_model_for(flux_like)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # two passes: one warning
            sd_model.forge_objects = sd_model.forge_objects_after_applying_lora.shallow_copy()
            forge_standin.apply_token_merging(sd_model, 0.5)
    assert sd_model.forge_objects.unet is sd_model.forge_objects_after_applying_lora.unet  # handed back as it came
    found = [str(w.message) for w in caught if "tokenmerge" in str(w.message)]
    assert len(found) == 1 and "leaves this model unchanged" in found[0]
