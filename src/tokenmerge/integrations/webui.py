"""AUTOMATIC1111 and Forge webui integration: their token-merging settings run through tokenmerge.

The two webuis route token merging differently (checked against their source, see the README):

- AUTOMATIC1111: ``modules/sd_models.py`` imports ``tomesd`` and its ``apply_token_merging`` calls
  ``tomesd.apply_patch(sd_model, ratio=r, use_rand=False, merge_attn=True, merge_crossattn=False,
  merge_mlp=False)`` / ``tomesd.remove_patch(sd_model)`` through that module attribute; :class:`WebuiTokenMerge`
  takes its place and serves the same calls with tokenmerge's hooks on the ldm/sgm UNet.
- Forge: ``apply_token_merging`` runs ``backend.misc.tomesd.TomePatcher().patch(model=unet_patcher, ratio=r)``
  on a fresh UNet patcher before each pass (no remove step); :class:`ForgeTokenMerge` takes the place of that
  class and registers tokenmerge on the patcher's attention patch points, which have ComfyUI's call forms and
  ``extra_options`` keys (:mod:`tokenmerge.integrations.comfyui`).

:func:`install` does whichever applies and says so; where neither exists it warns that the settings have no
effect. Every option but ``ratio`` (the webui's own slider) is a setting (:data:`SETTINGS`), made from the options'
declarations; enumerated options are offered as choices, never as free text.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

from ..config import OPTION_NAMES, TokenMergeConfig, ignored_by
from ..methods import OPTIONS, OWNERS, methods_on
from ..patch import apply_patch, end_generations, remove_patch
from .comfyui import patch_model

SECTION = ("tokenmerge", "Token Merging (tokenmerge)")


class Setting(NamedTuple):
    key: str  # the webui's option key
    option: str  # the tokenmerge option it sets
    default: Any
    label: str
    component: str  # gradio component: Radio, Dropdown, Slider, Checkbox, Number
    args: dict[str, Any]


# The webui's own settings pass ratio (its token-merging slider, the on-switch) and tomesd's other arguments; every
# other option is a setting here. use_rand starts off as the webui passes it (safe to turn on: deterministic here).
WEBUI_DEFAULTS = {"use_rand": False}


def setting(name: str) -> Setting:
    """The webui setting for option ``name``, made from its declaration (:mod:`tokenmerge.options`)."""
    option, owner = OPTIONS[name], OWNERS[name]
    label = f"Token merging{f' ({owner})' if owner else ''}: {option.widget_help}"
    default = WEBUI_DEFAULTS.get(name, option.widget_default)
    if option.words is not None:
        return Setting(
            f"tokenmerge_{name}", name, default, label, "Radio" if name == "method" else "Dropdown", {"choices": list(option.words)}
        )
    if option.kind == "bool":
        return Setting(f"tokenmerge_{name}", name, default, label, "Checkbox", {})
    low, high = option.widget_range
    if option.widget_max is None and option.high is None:  # no natural end: a number field
        return Setting(f"tokenmerge_{name}", name, default, label, "Number", {"precision": 0 if option.kind != "real" else None})
    return Setting(f"tokenmerge_{name}", name, default, label, "Slider", {"minimum": low, "maximum": high, "step": option.step or 1})


SETTINGS: tuple[Setting, ...] = tuple(setting(name) for name in OPTION_NAMES if name != "ratio")


def options_from(values: dict[str, Any]) -> dict[str, Any]:
    """tokenmerge options from the webui's setting values (missing settings keep their defaults)."""
    return {s.option: OPTIONS[s.option].from_widget(values.get(s.key, s.default)) for s in SETTINGS}


class WebuiTokenMerge:
    """AUTOMATIC1111: stands where the webui expects the ``tomesd`` module (``apply_patch`` / ``remove_patch``)."""

    def __init__(self, settings: Callable[[], dict[str, Any]]) -> None:
        self.settings = settings  # returns {setting key: value}, read at each patch

    def apply_patch(self, model: Any, **kwargs: Any) -> Any:
        options = {**kwargs, **options_from(self.settings())}
        # The webui passes tomesd's arguments (its ratio is the on-switch) and every setting: pass on only what the
        # chosen method reads, so that a setting for another method is not reported as without effect.
        ignored = ignored_by(options["method"])
        return apply_patch(model, **{k: v for k, v in options.items() if k not in ignored})

    def remove_patch(self, model: Any) -> Any:
        return remove_patch(model)


def forge_patcher(settings: Callable[[], dict[str, Any]]) -> type:
    """Forge: a class to stand where Forge expects ``backend.misc.tomesd.TomePatcher``."""

    class ForgeTokenMerge:
        """``ForgeTokenMerge().patch(model=unet_patcher, ratio=r)``: a patched clone of Forge's UNet patcher.

        Forge calls this without error handling before each pass (``modules/processing.py``), so a model tokenmerge
        cannot patch there (Forge's Flux, ``IntegratedFluxTransformer2DModel``: no UNet attention patch points) is
        handed back unchanged with one warning, as Forge's own patcher does, instead of aborting the generation."""

        warned: ClassVar[set[str]] = set()  # per Forge process: Forge makes a new patcher object per pass

        def patch(self, model: Any, ratio: float) -> Any:
            config = TokenMergeConfig(ratio=ratio, **options_from(settings()))
            config.warn_if_capped()
            if "forge" not in config.method_of.routes:
                if config.method not in self.warned:
                    self.warned.add(config.method)
                    warnings.warn(
                        f"tokenmerge: method={config.method!r} does not run on Forge: it keeps each image token's outputs of "
                        "every span of a transformer block (attention, cross-attention, MLP), and Forge's UNet patcher, like "
                        "ComfyUI's UNets, offers patch points around attention only (attn1, attn2), none around a block's MLP "
                        "or residual; Forge's token merging leaves the model unchanged (choose one of "
                        f"{', '.join(methods_on('forge'))}, or run it in AUTOMATIC1111 or diffusers)",
                        stacklevel=2,
                    )
                return model
            try:
                return patch_model(model, config)
            except TypeError as error:
                kind = type(getattr(getattr(model, "model", None), "diffusion_model", model)).__name__
                if kind not in self.warned:
                    self.warned.add(kind)
                    warnings.warn(f"tokenmerge: Forge's token merging leaves this model unchanged: {error}", stacklevel=2)
                return model

    return ForgeTokenMerge


def _at_step(shared: Any, params: Any) -> None:
    """AUTOMATIC1111's ``on_cfg_denoiser`` callback, before each step's denoiser call: a sampling's first step begins a
    new generation of its ``total_sampling_steps`` (what an interrupted or skipped one held is freed; an img2img or
    hires pass after it starts afresh)."""
    if getattr(params, "sampling_step", None) == 0 and getattr(shared, "sd_model", None) is not None:
        end_generations(shared.sd_model, getattr(params, "total_sampling_steps", None))


def install(shared: Any, script_callbacks: Any, sd_models: Any, gradio: Any) -> str | None:
    """Register the settings and route the webui's token merging through tokenmerge; returns "automatic1111",
    "forge", or None (with a warning) where this webui has neither route."""

    def settings() -> dict[str, Any]:
        return {s.key: getattr(shared.opts, s.key, s.default) for s in SETTINGS}

    def on_ui_settings() -> None:
        for s in SETTINGS:
            component = getattr(gradio, s.component)
            shared.opts.add_option(s.key, shared.OptionInfo(s.default, s.label, component, dict(s.args), section=SECTION))

    script_callbacks.on_ui_settings(on_ui_settings)
    if hasattr(sd_models, "tomesd"):
        sd_models.tomesd = WebuiTokenMerge(settings)
        if hasattr(script_callbacks, "on_cfg_denoiser"):
            script_callbacks.on_cfg_denoiser(lambda params: _at_step(shared, params))
        return "automatic1111"
    try:
        forge = importlib.import_module("backend.misc.tomesd")
    except ImportError:
        forge = None
    if forge is not None and hasattr(forge, "TomePatcher"):
        forge.TomePatcher = forge_patcher(settings)
        return "forge"
    message = (
        "tokenmerge: this webui has neither modules.sd_models.tomesd (AUTOMATIC1111) nor backend.misc.tomesd.TomePatcher "
        "(Forge); the token merging settings keep their built-in behaviour and tokenmerge's settings have no effect"
    )
    print(message)
    warnings.warn(message, stacklevel=2)
    return None
