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


class SayOnce:
    """What one patch says once per topic, never once per block or call, while its options hold (``renew()`` when
    they change lets each topic be said again): every front end's patch says through one."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix  # what every message starts with (the model's name)
        self.said: dict[str, int] = {}  # topic -> the options epoch in which it was said
        self.epoch = 0

    def renew(self) -> None:
        self.epoch += 1

    def pending(self, topic: str) -> bool:
        """Whether ``topic`` is yet to be said under these options (a message costly to make is made only then)."""
        return self.said.get(topic) != self.epoch

    def say(self, topic: str, message: str) -> None:
        if self.pending(topic):
            self.said[topic] = self.epoch
            warn_at_caller(f"tokenmerge: {self.prefix}{message}")


def _directory(name: str) -> str | None:
    module = sys.modules.get(name)
    paths = list(getattr(module, "__path__", None) or [])  # (a namespace package has no __file__)
    return os.path.abspath(paths[0]) + os.sep if paths else None
