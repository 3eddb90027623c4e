"""The node "Token Merging (tokenmerge)": MODEL + options -> patched MODEL, its inputs made from the options'
declarations (:mod:`tokenmerge.options`)."""

from __future__ import annotations

from typing import Any

from ...config import OPTION_NAMES, TokenMergeConfig
from ...methods import OPTIONS, OWNERS, SUMMARY
from .route import COMFY_METHODS, patch_model

# The node's inputs in the order saved workflows hold their widgets' values (positionally): the first node's
# required inputs, then the optional ones as they were added; every other option follows, optional (advanced).
REQUIRED = (
    "ratio",
    "max_downsample",
    "sx",
    "sy",
    "use_rand",
    "seed",
    "merge_crossattn",
    "method",
    "kv_factor",
    "kv_interpolation",
    "max_noise",
)
OPTIONAL = (
    "recompute",
    "refresh_every",
    "full_steps",
    "cache_dtype",
    "memory",
    *(
        name
        for name in OPTION_NAMES
        if name not in REQUIRED and name not in ("recompute", "refresh_every", "full_steps", "cache_dtype", "memory")
    ),
)


def node_input(name: str) -> tuple[Any, dict[str, Any]]:
    """The node's input for option ``name``, made from its declaration (:mod:`tokenmerge.options`)."""
    option = OPTIONS[name]
    owner = OWNERS[name]
    tooltip = f"method {owner}: {option.widget_help}" if owner else option.widget_help
    info: dict[str, Any] = {"default": option.widget_default, "tooltip": tooltip}
    if name == "method":
        return list(COMFY_METHODS), info
    if option.words is not None:
        return list(option.words), info
    if option.kind == "bool":
        return "BOOLEAN", info
    low, high = option.widget_range
    if option.kind == "real":
        return "FLOAT", {**info, "min": low, "max": high, "step": option.step or 0.01}
    return "INT", {**info, "min": low, "max": high}


class TokenMergeNode:
    """ComfyUI node "Token Merging (tokenmerge)": MODEL + options -> patched MODEL. Defaults come from
    :class:`tokenmerge.TokenMergeConfig`; enumerated options are choices, never free text."""

    CATEGORY = "model_patches/unet"
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    DESCRIPTION = f"Reduces the tokens a diffusion model's blocks work on: {SUMMARY}. SDXL gets its level automatically."

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        required = {"model": ("MODEL",)} | {name: node_input(name) for name in REQUIRED}
        return {"required": required, "optional": {name: node_input(name) for name in OPTIONAL}}

    def patch(self, model: Any, **values: Any) -> tuple[Any]:
        config = TokenMergeConfig(**{name: OPTIONS[name].from_widget(value) for name, value in values.items()})
        config.warn_if_capped()
        return (patch_model(model, config),)
