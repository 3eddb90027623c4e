"""AUTOMATIC1111 / Forge webui integration: a drop-in for the ``tomesd`` module the webui calls.

The webui's ``modules/sd_models.py`` imports ``tomesd`` and calls
``tomesd.apply_patch(sd_model, ratio=r, use_rand=False, merge_attn=True, merge_crossattn=False,
merge_mlp=False)`` and ``tomesd.remove_patch(sd_model)`` (again with another ratio for the hires pass).
The extension in ``webui_tokenmerge/`` replaces that module reference with a :class:`WebuiTokenMerge`,
which serves the same calls with tokenmerge and adds the options of the extension's settings. Because
tokenmerge's random partition is deterministic (see the README), the webui's ``use_rand=False``
workaround is no longer needed, and the setting can turn it back on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .patching import apply_patch, remove_patch

# Settings the extension adds (key, default, label); read through the ``options`` callable.
SETTINGS: tuple[tuple[str, Any, str], ...] = (
    ("tokenmerge_method", "tome", "Token merging: method, tome (merge tokens), todo (downsample keys/values) or auto (todo with a per-block factor)"),
    ("tokenmerge_kv_factor", 2, "Token merging: key/value downsampling factor (method todo)"),
    ("tokenmerge_use_rand", False, "Token merging: random destinations (deterministic, seeded by the option below)"),
    ("tokenmerge_seed", 0, "Token merging: seed of the random destinations"),
    ("tokenmerge_merge_crossattn", False, "Token merging: merge tokens for cross-attention too"),
)
_OPTION_NAMES = {key: key.removeprefix("tokenmerge_") for key, _, _ in SETTINGS}


class WebuiTokenMerge:
    """Stands where the webui expects the ``tomesd`` module: ``apply_patch`` / ``remove_patch``."""

    def __init__(self, settings: Callable[[], dict[str, Any]]) -> None:
        self.settings = settings  # returns {setting key: value}, read at each patch

    def options(self) -> dict[str, Any]:
        values = self.settings()
        return {_OPTION_NAMES[key]: values[key] for key in _OPTION_NAMES if key in values}

    def apply_patch(self, model: Any, **kwargs: Any) -> Any:
        return apply_patch(model, **{**kwargs, **self.options()})

    def remove_patch(self, model: Any) -> Any:
        return remove_patch(model)
