"""Patch a model, change its options, remove the patch: the public entry points."""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from .config import DEFAULTS, OPTION_NAMES, TOMESD_PARAMETERS, TokenMergeConfig, check_option_names
from .families import discover, get, roots_of
from .families.base import has_class_named
from .hooks import PatchState, install, states_in, states_of, uninstall
from .hooks.install import STATE_ATTR
from .hooks.sites import projections_fused
from .notices import warn_at_caller


def _patched_states(model: Any) -> list[tuple[torch.nn.Module, PatchState]]:
    return states_in(roots_of(model))


def _remove_tomesd(modules: list[torch.nn.Module]) -> bool:
    """Undo a tomesd patch (its block classes, hooks, and the ``_tome_info`` attributes that tomesd's own
    ``remove_patch`` leaves behind) among ``modules``; True if a patch was active."""
    found = False
    for module in modules:
        info = vars(module).get("_tome_info")
        if isinstance(info, dict):
            hooks = info.get("hooks", [])
            found = found or bool(hooks)
            for hook in hooks:
                hook.remove()
            hooks.clear()
            del module._tome_info
        if type(module).__name__ == "ToMeBlock" and isinstance(getattr(type(module), "_parent", None), type):
            found = True
            module.__class__ = type(module)._parent  # tomesd's generated subclass keeps the original as _parent
    return found


def _all_modules(model: Any) -> list[torch.nn.Module]:
    return [m for root in roots_of(model) for m in root.modules()]


def _warn_if_ineffective(states: list[PatchState], config: TokenMergeConfig) -> None:
    config.warn_if_capped()
    config.warn_if_ignored()
    levels = sorted({b.level for s in states for b in s.blocks})
    if not config.is_identity and not any(
        config.merges_level(level, s.layout.top_level) for s in states for level in {b.level for b in s.blocks}
    ):
        warn_at_caller(
            f"tokenmerge: no transformer block is merged: max_downsample={config.max_downsample} but this model's "
            f"attention blocks sit at downsampling factors {levels}; use max_downsample=None (auto) or >= {levels[0]}"
        )


# Attention processors that compute attention with their own kernel, outside torch's SDPA and diffusers' dispatch:
# the two routes key/value downsampling reaches (tokenmerge.hooks.attention, tokenmerge.hooks.dispatch).
_OWN_KERNELS = ("XFormers", "NPU", "FlashAttn", "SlicedAttn", "AttnProcessor2_5")


def _warn_if_unreachable(states: list[PatchState], config: TokenMergeConfig) -> None:
    """todo/auto on attention that bypasses both routes would silently do nothing there: say so at apply time."""
    if not config.method_of.reduces_keys or config.is_identity:
        return
    found = sorted(
        {
            type(site.module.processor).__name__
            for s in states
            for b in s.layout.blocks
            for site in b.kv_sites
            # A self-attention handed its keys and values by keyword is reduced whatever its processor.
            if (site.context_kwarg is None or projections_fused(site.module))
            and any(word in type(getattr(site.module, "processor", None)).__name__ for word in _OWN_KERNELS)
        }
    )
    if found:
        warn_at_caller(
            f"tokenmerge: method={config.method!r} downsamples keys and values at torch's scaled_dot_product_attention or "
            f"diffusers' dispatch_attention_fn; the attention processor(s) {', '.join(found)} compute attention another way, "
            "so their keys and values stay full (set the default processor, e.g. pipe.unet.set_default_attn_processor(), "
            "or use method='tome')"
        )


def _check_for_layouts(config: TokenMergeConfig, states_or_layouts: list[Any]) -> None:
    """Options that have no effect on a model are rejected, not ignored; a method its family does not offer, with why."""
    layouts = [getattr(x, "layout", x) for x in states_or_layouts]
    for layout in layouts:
        family = get(layout.family)
        if config.method not in family.methods:
            raise ValueError(
                f"method={config.method!r} is not offered on {family.title}: {family.unsupported}; method must be one of "
                f"{', '.join(family.methods)} there"
            )
    single = [layout for layout in layouts if layout.single_level]
    if single and config.max_downsample is not None:
        raise ValueError(
            f"max_downsample={config.max_downsample} has no effect on {_named(single[0])}: it has one token grid (level 1); "
            "leave max_downsample=None"
        )
    joint = [layout for layout in layouts if not get(layout.family).cross_attention]
    if joint and config.method_of.gathers and config.merge_crossattn:
        raise ValueError(
            f"merge_crossattn=True has no effect on {_named(joint[0])}: it has no separate text cross-attention (its "
            "attention is joint over image and text tokens, merged by merge_attn); leave merge_crossattn=False"
        )


def _warn_if_no_frames(config: TokenMergeConfig, states: list[PatchState]) -> None:
    """A frame option (``st``, a ``(t, h, w)`` kv_factor's t) on a model whose token grids have no frames is said once,
    at the patch, with the value in effect (before, each block said it at the first call)."""
    found = config.method_of.frame_option(config)
    if found is None or config.is_identity or any(get(s.layout.family).video for s in states):
        return
    option, effective = found
    warn_at_caller(
        f"tokenmerge: {option} acts on the frames of a video's token grid; the token grids of {_named(states[0].layout)} have "
        f"none, so it acts on their spatial sides only (in effect: {effective})"
    )


def _named(layout: Any) -> str:
    """'the Flux.1 transformer (FluxTransformer2DModel)': a denoiser named by its family and class."""
    return f"the {get(layout.family).title} {get(layout.family).kind} ({type(layout.root).__name__})"


def apply_patch(
    model: Any,
    ratio: float = DEFAULTS.ratio,
    max_downsample: int | None = DEFAULTS.max_downsample,
    sx: int = DEFAULTS.sx,
    sy: int = DEFAULTS.sy,
    use_rand: bool = DEFAULTS.use_rand,
    merge_attn: bool = DEFAULTS.merge_attn,
    merge_crossattn: bool = DEFAULTS.merge_crossattn,
    merge_mlp: bool | None = DEFAULTS.merge_mlp,
    *,
    config: TokenMergeConfig | None = None,
    **options: Any,
) -> Any:
    """Patch ``model`` in place and return it: tomesd 0.1.3's signature and defaults (except
    ``max_downsample=None``: the highest-resolution level that has attention), every other option by keyword
    (``seed``, ``method``, ``kv_factor``, ...: the fields of :class:`tokenmerge.TokenMergeConfig`), or all of
    them as ``config=``.

    ``model``: a diffusers pipeline (its UNet or transformer and every ControlNet are patched), a diffusers
    UNet, an SD3 / Flux / PixArt / DiT transformer, the webui's latent-diffusion object or an ldm/sgm
    ``UNetModel``. Patching again replaces the previous patch (and a tomesd patch).
    """
    given = dict(zip(TOMESD_PARAMETERS, (ratio, max_downsample, sx, sy, use_rand, merge_attn, merge_crossattn, merge_mlp)))
    if config is not None:
        if not isinstance(config, TokenMergeConfig):
            raise TypeError(f"config must be a tokenmerge.TokenMergeConfig, got {type(config).__name__}")
        mixed = [n for n, v in given.items() if v is not getattr(DEFAULTS, n) and v != getattr(DEFAULTS, n)] + sorted(options)
        if mixed:
            raise TypeError(f"pass options either in config= or as arguments, not both (got config= and {', '.join(mixed)})")
    else:
        check_option_names(options)
        config = TokenMergeConfig(**given, **options)
    found = discover(model)
    _check_for_layouts(config, found.layouts)
    if _remove_tomesd(found.modules):
        warn_at_caller("tokenmerge: this model was patched by tomesd; that patch is removed and replaced")
    for root, patch in states_of(found.modules):
        uninstall(root, patch)
    states = [install(layout, config) for layout in found.layouts]
    if has_class_named(model, "DiffusionPipeline"):
        for state in states:  # its scheduler's steps: where the few-step rule reads a generation's schedule
            state.pipeline = weakref.ref(model)
    _warn_if_ineffective(states, config)
    _warn_if_no_frames(config, states)
    _warn_if_unreachable(states, config)
    if found.compiled:
        warn_at_caller(
            f"tokenmerge: {', '.join(found.compiled)} is already compiled (torch.compile or module.compile()); graphs compiled "
            "before this patch ignore it (torch skips module-hook guards by default). Patch before compiling, or call "
            "torch._dynamo.reset() after patching, or set torch._dynamo.config.skip_nnmodule_hook_guards = False"
        )
    return model


def remove_patch(model: Any) -> Any:
    """Undo :func:`apply_patch` (and a tomesd patch): every hook, wrapper and attribute it added is removed.
    Returns what tomesd's ``remove_patch`` returns (a pipeline's ``unet``, else ``model``)."""
    modules = _all_modules(model)
    for root, patch in states_of(modules):
        uninstall(root, patch)
    _remove_tomesd(modules)
    unet = getattr(model, "unet", None)
    return model if unet is None else unet


def update_options(model: Any, **changes: Any) -> TokenMergeConfig:
    """Change options of a patched model (ratio, seed, method, ...) without re-patching; calls that begin
    afterwards use them. Returns the new config."""
    states = [s for _, s in _patched_states(model)]
    if not states:
        raise ValueError(f"{type(model).__name__} is not patched by tokenmerge; call tokenmerge.apply_patch first")
    config = states[0].config.replace(**changes)
    _check_for_layouts(config, states)
    for state in states:
        state.set_config(config)
    _warn_if_ineffective(states, config)
    _warn_if_no_frames(config, states)
    _warn_if_unreachable(states, config)
    return config


def named_states(model: Any) -> list[tuple[str, PatchState]]:
    """Each patched denoiser of ``model`` with where it sits: a pipeline's component name, with the module's path
    inside it where it is not the component itself (``"transformer"``, ``"controlnet"``, ``"transformer_2"``); a
    module's path in the model ("" for the model itself)."""
    if has_class_named(model, "DiffusionPipeline"):
        named = [(k, v) for k, v in (getattr(model, "components", {}) or {}).items() if isinstance(v, torch.nn.Module)]
    else:
        named = [("", root) for root in roots_of(model)]
    found = []
    for component, root in named:
        for path, module in root.named_modules():
            state = vars(module).get(STATE_ATTR)
            if isinstance(state, PatchState):
                found.append((".".join(p for p in (component, path) if p), state))
    return found


def get_configs(model: Any) -> dict[str, TokenMergeConfig]:
    """The options of each patched denoiser of ``model``, by where it sits (:func:`named_states`; the class name for
    the model itself); empty if nothing is patched."""
    return {name or type(state.layout.root).__name__: state.config for name, state in named_states(model)}


def get_config(model: Any) -> TokenMergeConfig | None:
    """The options a model is patched with, or ``None`` if it is not patched. Where its denoisers carry different
    options (a ControlNet's changed on their own), the first one's, said with each one's: :func:`get_configs`."""
    configs = get_configs(model)
    if len(set(configs.values())) > 1:
        first = next(iter(configs))
        fields = [f for f in OPTION_NAMES if len({getattr(c, f) for c in configs.values()}) > 1]
        differ = "; ".join(f"{name}: {', '.join(f'{f}={getattr(c, f)!r}' for f in fields)}" for name, c in configs.items())
        warn_at_caller(
            f"tokenmerge: the patched parts of this {type(model).__name__} have different options ({differ}); get_config "
            f"returns {first}'s, tokenmerge.get_configs(model) each one's"
        )
    return next(iter(configs.values()), None)


def end_generations(model: Any, steps: int | None = None) -> None:
    """The generations of ``model``'s patched denoisers running in this thread are over: what a per-generation method
    holds for them is freed, and the next call starts a new one. Front ends that know where a generation begins or
    ends call it (the webui at each sampling's first step), with the steps of the one that begins where they know
    them (a few-step schedule is cached from its second step)."""
    for _, state in _patched_states(model):
        state.end_generations()
        state.known_steps = steps


@contextlib.contextmanager
def generation(model: Any) -> Iterator[Any]:
    """``with tokenmerge.generation(model): <a sampling loop>``: the calls of ``model`` in this thread inside the block
    are one generation, begun afresh and freed when the block ends, also on an exception or a break. A loop of one's
    own that calls a patched denoiser needs it where generations would otherwise be told apart by their noise levels
    alone (one-step generations at one timestep, an img2img pass after an interrupted run); a diffusers pipeline's
    own calls, ComfyUI's sampling runs and the webui's are scoped already."""
    end_generations(model)
    try:
        yield model
    finally:
        end_generations(model)


@contextlib.contextmanager
def patched(model: Any, *args: Any, **options: Any) -> Iterator[Any]:
    """``with tokenmerge.patched(pipe, ratio=0.5): ...``: the patch holds inside the block; after it (also on an
    exception) the model is as it was found: unpatched, or patched by tokenmerge with its earlier options (each
    denoiser its own). A tomesd patch it replaced is not put back (said)."""
    before = [(root, state.config, state.pipeline) for root, state in _patched_states(model)]
    had_tomesd = any(isinstance(vars(m).get("_tome_info"), dict) for m in _all_modules(model))
    apply_patch(model, *args, **options)
    try:
        yield model
    finally:
        remove_patch(model)
        with warnings.catch_warnings():  # said when these options were first applied
            warnings.simplefilter("ignore")
            for root, config, pipeline in before:
                apply_patch(root, config=config)
                for _, state in _patched_states(root):  # (its pipeline's schedule still scopes its generations)
                    state.pipeline = pipeline
        if had_tomesd:
            warn_at_caller("tokenmerge: patched() replaced a tomesd patch; it is not put back (call tomesd.apply_patch again)")
