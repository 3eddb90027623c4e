"""Configurations named on the command line (``tokenmerge bench`` / ``tokenmerge eval``), e.g.

``tome:0.5`` (ratio), ``todo:2`` (key/value factor), ``auto``, ``tokencache`` or ``tokencache:0.25`` (the fraction
recomputed), ``tomesd:0.5`` (the reference library)
and any tokenmerge option after a comma: ``tome:0.5,share_plan=true,reuse_steps=3,match_dtype=bfloat16``;
with ``+`` an accelerator for whole sampling loops (``bench --steps``, ``eval``): one of a UNet pipeline's
(:mod:`tokenmerge.tools.pipelines`: ``deepcache``, ``freeu``, ``slicing``) or a transformer's step cache
(:mod:`tokenmerge.tools.caches`: ``fbcache``, ``taylorseer``, ``magcache``, ``fastercache``, ``pab``, ``dbcache``, ``dbcache-nocal``):
``auto+deepcache``, ``tome:0.5+fbcache``, or an accelerator alone: ``dbcache``.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .. import apply_patch, remove_patch
from ..config import OPTION_NAMES, TokenMergeConfig, ignored_by
from ..methods import METHODS, OPTIONS, REGISTRY
from .caches import CACHES, NAMES, Clock, enable_cache
from .pipelines import PIPELINE_ACCELERATORS, PIPELINE_NAMES

SPEC_METHODS = (*METHODS, "tomesd")  # "none": accelerators alone
# How results name a configuration: "tokenmerge {method} {value}", but for these (the labels earlier results carry)
_LABELS = {"tome": "tokenmerge r={}", "todo": "tokenmerge todo f={}"}
ACCELERATORS = (*PIPELINE_ACCELERATORS, *CACHES)
_FORMAT = f"tome:0.5, todo:2, auto, tokencache[:0.25] or tomesd:0.5, optionally followed by ,option=value and +accelerator ({', '.join(ACCELERATORS)})"


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

    method: str  # "none": an accelerator alone
    value: float | tuple[int, ...] | None = None  # ratio (tome, tomesd) or key/value factor (todo: or (t, h, w)); None for auto
    options: dict[str, Any] = field(default_factory=dict)
    accelerators: tuple[str, ...] = ()

    @classmethod
    def parse(cls, spec: str) -> PatchSpec:
        parts = spec.split("+")
        accelerators = [p for p in parts if p in ACCELERATORS]
        patches = [p for p in parts if p not in ACCELERATORS]  # in any order: auto+dbcache or dbcache+auto
        if len(patches) > 1:
            raise ValueError(f"configuration must look like {_FORMAT}; more than one method, or unknown accelerator(s), in {spec!r}")
        first = patches[0] if patches else "none"
        if first == "none":
            return cls("none", accelerators=tuple(accelerators))
        parsed = cls._parse_patch(first, spec)
        return cls(parsed.method, parsed.value, parsed.options, tuple(accelerators))

    @classmethod
    def _parse_patch(cls, text: str, spec: str) -> PatchSpec:
        head, *extras = text.split(",")
        method, _, value = head.partition(":")
        primary = REGISTRY[method].primary if method in REGISTRY else "ratio"  # (tomesd's)
        if method not in SPEC_METHODS or (primary is None and value) or (method in ("tome", "todo", "tomesd") and not value):
            raise ValueError(f"configuration must look like {_FORMAT}; got {spec!r}")
        options: dict[str, Any] = {}
        for extra in extras:
            name, eq, text = extra.partition("=")
            if not eq or name not in OPTION_NAMES or method == "tomesd":
                raise ValueError(f"{spec!r}: options are name=value with a tokenmerge option ({', '.join(OPTION_NAMES)}), not for tomesd")
            options[name] = _parse_value(text)
        if method == "todo" and "x" in value:  # todo:2x2x2, a (t, h, w) factor for video
            try:
                factors: Any = tuple([int(v) for v in value.split("x")])
            except ValueError:
                raise ValueError(f"configuration must look like {_FORMAT}; got {spec!r}") from None
            parsed = cls(method, factors, options)
        else:
            try:
                parsed = cls(method, float(value) if value else None, options)
            except ValueError:
                raise ValueError(f"configuration must look like {_FORMAT}; got {spec!r}") from None
        if method != "tomesd":
            TokenMergeConfig(**parsed.kwargs())  # reject bad values now, not after an hour of benchmarking
        return parsed

    def kwargs(self) -> dict[str, Any]:
        """tokenmerge.apply_patch keyword arguments."""
        base: dict[str, Any] = {"method": self.method}
        primary = REGISTRY[self.method].primary
        if primary is not None and self.value is not None:
            base[primary] = OPTIONS[primary].from_widget(self.value)  # (todo:2 -> kv_factor=2, an int)
        return base | self.options

    @property
    def name(self) -> str:
        accelerators = [(PIPELINE_NAMES | NAMES)[a] for a in self.accelerators]
        if self.method == "none":
            return " + ".join(accelerators)
        if self.method == "tomesd":
            head = f"tomesd 0.1.3 r={self.value:g}"
        else:
            value = "x".join(map(str, self.value)) if isinstance(self.value, tuple) else f"{self.value:g}" if self.value is not None else ""
            head = _LABELS.get(self.method, f"tokenmerge {self.method} {{}}").format(value).rstrip()
            head += "".join(f" {k}={v}" for k, v in self.options.items())
        return " + ".join([head, *accelerators])

    @property
    def caches(self) -> tuple[str, ...]:
        """The step caches among the accelerators (they act on a transformer, not on a pipeline)."""
        return tuple(a for a in self.accelerators if a in CACHES)

    @contextlib.contextmanager
    def applied(self, target: Any, clock: Clock | None = None, **defaults: Any) -> Iterator[None]:
        """Patch ``target`` (and turn the accelerators on: a pipeline's on ``target`` then being a pipeline, a step
        cache on ``target`` then being a transformer, reading the loop's step from ``clock``) for the block's
        duration. ``defaults`` (e.g. seed) apply unless the spec sets them; tomesd only gets ``max_downsample``
        (its own default of 1 does nothing on SDXL)."""
        from .pipelines import enable

        if self.caches and clock is None:
            raise ValueError(f"{self.name}: step caches ({', '.join(self.caches)}) run in whole sampling loops of a transformer")

        if self.method == "tomesd":
            import tomesd

            level = {"max_downsample": defaults["max_downsample"]} if defaults.get("max_downsample") else {}
            tomesd.apply_patch(target, ratio=self.value, **level)
        elif self.method != "none":
            ignored = ("max_downsample", *ignored_by(self.method))  # defaults the method does not read are not passed
            apply_patch(target, **({k: v for k, v in defaults.items() if k not in ignored} | self.kwargs()))
        offs = []
        try:
            for accelerator in self.accelerators:
                if accelerator in CACHES:
                    offs.append(enable_cache(target, accelerator, clock))  # type: ignore[arg-type]
                else:
                    offs.append(enable(target, accelerator, clock.timesteps if clock is not None else ()))
            yield
        finally:
            for off in reversed(offs):
                off()
            if self.method == "tomesd":
                import tomesd

                tomesd.remove_patch(target)
            elif self.method != "none":
                remove_patch(target)


def available(specs: list[PatchSpec]) -> list[PatchSpec]:
    """The specs whose library is installed (tomesd is optional)."""
    has_tomesd = importlib.util.find_spec("tomesd") is not None
    return [s for s in specs if s.method != "tomesd" or has_tomesd]
