"""tokenmerge's warnings point at the user's line: the one that ran the model, for those raised while it runs (from
a hook, a layout reader, an attention route), not the hook inside torch's ``Module.__call__``; the one that patched
it, for those of a patch (also through ``patched()``'s context manager). The call stack between the two (a pipeline,
a sampler, a cache's wrapper, ``contextlib``) has no fixed depth, so a fixed ``stacklevel`` cannot."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Libraries whose frames lie between a user's call and a hook: skipped when they are loaded (never imported here).
_RUNNERS = ("torch", "diffusers", "cache_dit", "comfy", "ldm", "sgm", "transformers", "accelerate")


def warn_at_caller(message: str) -> None:
    """``warnings.warn(message)`` attributed to the first frame outside tokenmerge and the libraries that run it."""
    skipped = (_PACKAGE, os.path.abspath(contextlib.__file__), *filter(None, map(_directory, _RUNNERS)))
    frame, level = sys._getframe(1), 2  # stacklevel 2: warn_at_caller's caller
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(skipped):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, stacklevel=level)


def _directory(name: str) -> str | None:
    module = sys.modules.get(name)
    paths = list(getattr(module, "__path__", None) or [])  # (a namespace package has no __file__)
    return os.path.abspath(paths[0]) + os.sep if paths else None
