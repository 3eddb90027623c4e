"""Configurations named on the command line (``tokenmerge bench`` / ``tokenmerge eval``), e.g.

``tome:0.5`` (ratio), ``todo:2`` (key/value factor), ``auto``, ``tomesd:0.5`` (the reference library)
and any tokenmerge option after a comma: ``tome:0.5,share_plan=true,reuse_steps=3,match_dtype=bfloat16``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

from .. import apply_patch, remove_patch
from ..config import OPTION_NAMES, TokenMergeConfig

METHODS = ("tome", "todo", "auto", "tomesd")
_FORMAT = "tome:0.5, todo:2, auto or tomesd:0.5, optionally followed by ,option=value"


def _parse_value(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


@dataclass(frozen=True)
class PatchSpec:
    """One configuration to compare against vanilla."""

    method: str
    value: float | None = None  # ratio (tome, tomesd) or key/value factor (todo); None for auto
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str) -> PatchSpec:
        head, *extras = spec.split(",")
        method, _, value = head.partition(":")
        if method not in METHODS or (method == "auto") != (value == ""):
            raise ValueError(f"configuration must look like {_FORMAT}; got {spec!r}")
        options: dict[str, Any] = {}
        for extra in extras:
            name, eq, text = extra.partition("=")
            if not eq or name not in OPTION_NAMES or method == "tomesd":
                raise ValueError(f"{spec!r}: options are name=value with a tokenmerge option ({', '.join(OPTION_NAMES)}), not for tomesd")
            options[name] = _parse_value(text)
        parsed = cls(method, None if method == "auto" else float(value), options)
        if method != "tomesd":
            TokenMergeConfig(**parsed.kwargs())  # reject bad values now, not after an hour of benchmarking
        return parsed

    def kwargs(self) -> dict[str, Any]:
        """tokenmerge.apply_patch keyword arguments."""
        base: dict[str, Any] = {"method": self.method}
        if self.method == "tome":
            base["ratio"] = self.value
        elif self.method == "todo":
            base["kv_factor"] = int(self.value)  # type: ignore[arg-type]
        return base | self.options

    @property
    def name(self) -> str:
        if self.method == "tomesd":
            return f"tomesd 0.1.3 r={self.value:g}"
        head = {"tome": "tokenmerge r={:g}", "todo": "tokenmerge todo f={:g}", "auto": "tokenmerge auto"}[self.method]
        extras = "".join(f" {k}={v}" for k, v in self.options.items())
        return head.format(self.value) + extras

    def patch(self, target: Any, **defaults: Any) -> None:
        """Patch ``target``; ``defaults`` (e.g. seed) apply unless the spec sets them. For tomesd, only
        ``max_downsample`` is passed on (tomesd's default of 1 does nothing on SDXL)."""
        if self.method == "tomesd":
            import tomesd

            level = {"max_downsample": defaults["max_downsample"]} if defaults.get("max_downsample") else {}
            tomesd.apply_patch(target, ratio=self.value, **level)
        else:
            apply_patch(target, **({k: v for k, v in defaults.items() if k != "max_downsample"} | self.kwargs()))

    def unpatch(self, target: Any) -> None:
        if self.method == "tomesd":
            import tomesd

            tomesd.remove_patch(target)
        else:
            remove_patch(target)


def available(specs: list[PatchSpec]) -> list[PatchSpec]:
    """The specs whose library is installed (tomesd is optional)."""
    has_tomesd = importlib.util.find_spec("tomesd") is not None
    return [s for s in specs if s.method != "tomesd" or has_tomesd]
