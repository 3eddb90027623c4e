"""Which route a MODEL takes: its diffusion transformer's (ComfyUI's attention override, :mod:`.dit`, or its block
replace patches, :mod:`.blocks`) or its UNet's attention patch points (:mod:`.unet`). :func:`patch_model` is what
the node and Forge's UNet patcher call."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from ...config import TokenMergeConfig
from ...families import comfy_model_of
from ...methods import methods_on
from .blocks import DitBlocks, DitKeyFill, add_block_patches, drop_block_patches
from .dit import OVERRIDE, WRAPPER_KEY, AttentionOverride, DitKeyValues, DitPatch
from .unet import patch_unet

COMFY_METHODS = methods_on("comfyui-unet", "comfyui-dit", "comfyui-blocks")  # what the node offers


def patch_model(model_patcher: Any, config: TokenMergeConfig) -> Any:
    """A clone of ``model_patcher`` with tokenmerge registered on ComfyUI's attention patch points (UNets) or its
    attention override or block patches (diffusion transformers, :mod:`.dit`, :mod:`.blocks`)."""
    if config.method not in COMFY_METHODS:
        raise ValueError(
            f"method={config.method!r} does not run through ComfyUI's model patcher yet (it runs in diffusers and the "
            f"webui); method must be one of {', '.join(COMFY_METHODS)} here"
        )
    dit = patch_dit(model_patcher, config)
    if dit is not None:
        return dit
    if "comfyui-unet" not in config.method_of.routes:
        raise ValueError(
            f"method={config.method!r} runs on ComfyUI's diffusion transformers, around their blocks; ComfyUI's UNets offer "
            "patch points around attention only; method must be one of "
            f"{', '.join(methods_on('comfyui-unet'))} on a UNet"
        )
    return patch_unet(model_patcher, config)


def patch_dit(model_patcher: Any, config: TokenMergeConfig) -> Any | None:
    """A clone of ``model_patcher`` with ``config``'s method on its diffusion transformer: ToMe around its blocks
    (:mod:`.blocks`) where the family offers them, keys and values through the attention override otherwise;
    None when the model is not a diffusion transformer tokenmerge knows in ComfyUI."""
    diffusion_model = model_patcher.model.diffusion_model
    unet_config = getattr(getattr(model_patcher.model, "model_config", None), "unet_config", None) or {}
    model = comfy_model_of(diffusion_model, unet_config.get("image_model"))
    if model is None:
        return None
    route = model.route_for(config.method_of)
    if route is None:
        warnings.warn(
            f"tokenmerge: method={config.method!r} is not available on ComfyUI's {model.title}: it runs around whole blocks, "
            "this model's blocks offer no replace patch tokenmerge reads, and the attention override sees one attention call, "
            "not its block; using method='auto' (keys and values of a downsampled grid)",
            stacklevel=3,
        )
        config = dataclasses.replace(config, method="auto")
        route = model.route_for(config.method_of)
    patched = model_patcher.clone()
    options = patched.model_options.setdefault("transformer_options", {})
    previous = options.get(OVERRIDE)
    earlier = isinstance(previous, AttentionOverride)
    if earlier:
        previous = previous.previous
        if previous is None:
            del options[OVERRIDE]
        else:
            options[OVERRIDE] = previous
    if drop_block_patches(patched) or earlier:  # the node applied twice in a chain: the second replaces the first
        warnings.warn("tokenmerge: this MODEL already carries a tokenmerge patch; it is replaced by this node's options", stacklevel=3)
        patched.remove_wrappers_with_key("apply_model", WRAPPER_KEY)
        patched.remove_wrappers_with_key("outer_sample", WRAPPER_KEY)
    patch = model.patch_of(diffusion_model)
    if route == "comfyui-blocks" and config.method_of.per_generation:
        wrapper: DitPatch = DitKeyFill(config, model, patch, previous, model.pad_of(diffusion_model))
        add_block_patches(patched, wrapper, diffusion_model)
        options[OVERRIDE] = wrapper
        patched.add_wrapper_with_key("outer_sample", WRAPPER_KEY, wrapper.sampling)
    elif route == "comfyui-blocks":
        wrapper = DitBlocks(config, model, patch, model.pad_of(diffusion_model))
        add_block_patches(patched, wrapper, diffusion_model)
    else:
        wrapper = DitKeyValues(config, model, patch, previous, model.pad_of(diffusion_model))
        options[OVERRIDE] = wrapper
    patched.add_wrapper_with_key("apply_model", WRAPPER_KEY, wrapper.apply_model)
    return patched
