"""The validated option set of one patch, made from the options the methods declare (:mod:`tokenmerge.options`).

Arguments are checked once, here, so the hot path (hooks run for every block at every step) can trust them. Every
error names the argument and the values it accepts. The fields, their defaults and checks come from
:data:`tokenmerge.methods.OPTIONS`: an option is declared once, by the method that reads it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from . import methods
from .algorithms.randomness import fold_seed
from .methods import AUTO_MAX_NOISE, METHODS, OPTIONS, REGISTRY
from .notices import warn_at_caller
from .options import COMMON as COMMON_OPTIONS

# Options every method reads (the others belong to the methods that declare them: tokenmerge.methods).
COMMON = tuple(o.name for o in COMMON_OPTIONS)
# tomesd 0.1.3's positional parameters, in its order (the config's first fields); every other option is keyword-only.
TOMESD_PARAMETERS = ("ratio", "max_downsample", "sx", "sy", "use_rand", "merge_attn", "merge_crossattn", "merge_mlp")
__all__ = ["AUTO_MAX_NOISE", "COMMON", "DEFAULTS", "METHODS", "OPTION_NAMES", "TokenMergeConfig"]


class _Config:
    """What a :class:`TokenMergeConfig` knows beyond its fields (the dataclass is made from the options below)."""

    def __post_init__(self) -> None:
        for option in OPTIONS.values():
            object.__setattr__(self, option.name, option.check(getattr(self, option.name)))
        for method in REGISTRY.values():
            method.validate(self)

    def merges(self, option: str, transformer: bool) -> bool:
        """Whether the sub-layers switched by ``option`` (merge_attn, ...) run on merged tokens, in a UNet or in a
        transformer (``merge_mlp=None`` is on in transformers only)."""
        value = getattr(self, option)
        return transformer if value is None else value

    @property
    def method_of(self) -> methods.Method:
        """The method these options run (:mod:`tokenmerge.methods`)."""
        return methods.get(self.method)

    @property
    def noise_limit(self) -> float:
        """The highest noise level at which blocks are reduced (``max_noise``, else the method's default; 1 = every
        step)."""
        return self.max_noise if self.max_noise is not None else self.method_of.default_max_noise

    @property
    def few_step_share(self) -> float | None:
        """On a few-step schedule, the share of its last steps the default gate reduces instead of ``noise_limit``
        (:mod:`tokenmerge.steps`); None where ``max_noise`` is given or the method has no such rule."""
        return None if self.max_noise is not None or self.is_identity else self.method_of.few_step_share

    @property
    def max_ratio(self) -> float:
        """The largest ratio the sx×sy destination grid can reach: all but one token per window."""
        return 1.0 - 1.0 / (self.sx * self.sy)

    def kv_factors(self, rank: int) -> tuple[int, ...]:
        """``kv_factor`` per axis of a grid of ``rank`` axes: an int on the two spatial axes (frames kept), a
        ``(t, h, w)`` tuple aligned on the last axes."""
        if isinstance(self.kv_factor, int):
            return (self.kv_factor,) if rank == 1 else (1,) * (rank - 2) + (self.kv_factor, self.kv_factor)
        factors = (1,) * max(0, rank - 3) + self.kv_factor
        return factors[-rank:]

    def warn_if_capped(self) -> None:
        """What the method says of these options whatever the model (never cap silently)."""
        for message in self.method_of.warnings_at_patch(self):
            warn_at_caller(message)

    def warn_if_ignored(self) -> None:
        """Warn about options set away from their defaults that the chosen method does not use."""
        changed = [f"{name}={getattr(self, name)!r}" for name in ignored_by(self.method) if getattr(self, name) != getattr(DEFAULTS, name)]
        if changed:
            warn_at_caller(f"tokenmerge: method={self.method!r} does not use {', '.join(changed)}; it has no effect")

    @property
    def is_identity(self) -> bool:
        """True when these options leave every block unchanged (ratio 0 for tome, factor 1 for todo)."""
        return self.method_of.is_identity(self)

    def merges_level(self, level: int, top_level: int) -> bool:
        """Whether blocks at downsampling ``level`` are patched: up to ``max_downsample``, else up to
        ``top_level`` (the model's highest-resolution level with attention) for tome/todo, and every level
        for auto, whose per-block rule leaves small grids alone."""
        if self.max_downsample is not None:
            return level <= self.max_downsample
        return self.method_of.every_level or level <= top_level

    @property
    def seed_key(self) -> int:
        """The 32-bit key of ``seed`` (all of its bits folded in)."""
        return fold_seed(0 if self.seed is None else self.seed)

    def replace(self, **changes: Any) -> Any:
        check_option_names(changes)
        return dataclasses.replace(self, **changes)


OPTION_NAMES: tuple[str, ...] = (*TOMESD_PARAMETERS, *(name for name in OPTIONS if name not in TOMESD_PARAMETERS))


def _docstring() -> str:
    lines = ["Options of a patch, with tomesd 0.1.3's names and defaults (except ``max_downsample``). Each option:", ""]
    for name in OPTION_NAMES:
        o = OPTIONS[name]
        none = f" ``None``: {o.none}." if o.none is not None else ""
        lines.append(f"- {name} ({o.allowed}; default {o.default!r}): {o.help}.{none} {o.doc}".rstrip())
    return "\n".join(lines)


TokenMergeConfig = dataclasses.make_dataclass(
    "TokenMergeConfig",
    [(name, OPTIONS[name].annotation, dataclasses.field(default=OPTIONS[name].default)) for name in OPTION_NAMES],
    bases=(_Config,),
    frozen=True,
)
TokenMergeConfig.__module__ = __name__
TokenMergeConfig.__doc__ = _docstring()


def ignored_by(method: str) -> tuple[str, ...]:
    """The options ``method`` does not read."""
    reads = methods.get(method).reads
    return tuple(name for name in OPTION_NAMES if name not in COMMON and name not in reads)


DEFAULTS = TokenMergeConfig()


def check_option_names(options: dict[str, Any]) -> None:
    """Reject unknown keywords with the list of valid ones (a typo must not be ignored)."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; valid options are: {', '.join(OPTION_NAMES)}")
