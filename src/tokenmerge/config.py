"""The validated option set of one patch: the single source of every option's name, default and check.

Arguments are checked once, here, so the hot path (hooks run for every block at every step) can trust
them. Every error names the argument and the values it accepts. Numbers are accepted as drop-in code
passes them (Python, NumPy or 0-d tensor scalars); booleans and strings are not numbers here.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

from . import methods
from .algorithms.randomness import fold_seed
from .algorithms.stores import CACHE_DTYPES
from .methods import AUTO_MAX_NOISE, METHODS
from .notices import warn_at_caller

MATCH_DTYPES = ("float32", "float16", "bfloat16")
MEMORY = ("default", "low")  # method tokencache's memory setting
DEFAULT_CACHE_DTYPE = "int8"
KV_INTERPOLATIONS = ("nearest-exact", "nearest", "bilinear", "bicubic", "area")
# Options every method reads (the others belong to the methods that declare them: tokenmerge.methods).
COMMON = ("method", "max_downsample", "max_noise", "merge_attn")
__all__ = ["AUTO_MAX_NOISE", "COMMON", "DEFAULTS", "METHODS", "OPTION_NAMES", "TokenMergeConfig"]


def _scalar(value: Any) -> Any:
    """A 0-d tensor's Python value; anything else unchanged."""
    if type(value).__name__ == "Tensor" and getattr(value, "ndim", None) == 0 and not value.dtype.is_complex:
        return value.item()
    return value


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or type(value).__name__ in ("bool_", "bool")


def _as_int(name: str, value: Any, allowed: str) -> int:
    value = _scalar(value)
    if _is_bool(value) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {allowed}, got {value!r}")
    return int(value)


def _as_real(name: str, value: Any, allowed: str) -> float:
    value = _scalar(value)
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {allowed}, got {value!r}")
    return float(value)


def _as_factor(value: Any) -> int | tuple[int, int, int]:
    """``kv_factor``: an int >= 1, or a (t, h, w) sequence of three."""
    allowed = "an int >= 1 or a (t, h, w) tuple of ints >= 1"
    if isinstance(value, (tuple, list)):
        if len(value) != 3:
            raise ValueError(f"kv_factor must be {allowed}, got {value!r}")
        factors = tuple([_as_int("kv_factor", v, allowed) for v in value])
    else:
        factors = (_as_int("kv_factor", value, allowed),)
    if min(factors) < 1:
        raise ValueError(f"kv_factor must be {allowed}, got {value!r}")
    return factors[0] if len(factors) == 1 else factors


def _as_bool(name: str, value: Any) -> bool:
    value = _scalar(value)
    if not _is_bool(value):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _as_choice(name: str, value: Any, choices: tuple[str, ...], none: bool = False) -> str | None:
    if value is None and none:
        return None
    if value not in choices:
        allowed = ("None or " if none else "") + ", ".join(choices)
        if name in ("match_dtype", "cache_dtype"):
            allowed += " (or the torch dtypes of those names)"
        raise ValueError(f"{name} must be {'one of ' if not none else ''}{allowed}, got {value!r}")
    return value


@dataclass(frozen=True)
class TokenMergeConfig:
    """Options of a patch, with tomesd 0.1.3's names and defaults (except ``max_downsample``).

    - ratio: fraction of a block's tokens merged away, in [0, 1). At most ``1 - 1/(sx*sy)`` can be
      reached (one destination token is kept per sx×sy window); more warns and uses that maximum.
    - max_downsample: merge only in blocks whose latent is downsampled at most this much (1, 2, 4, 8, ...).
      ``None`` means the highest-resolution level that has attention: 1 on SD 1.x/2.x, 2 on SDXL (whose top
      level has no attention, so tomesd's default of 1 does nothing there). Transformers (SD3, Flux, PixArt)
      have one level, 1: any value other than ``None`` is rejected there.
    - sx, sy: window of the destination grid, in tokens (on a transformer: in patch tokens).
    - st: frames of that window on a video's (frames, height, width) grid: one destination per st×sy×sx tokens
      (1: every frame has its own destinations; sources still match destinations of any frame). Images ignore it.
    - use_rand: pick the destination token of each window at random (derived from ``seed``, the block and
      the timestep; see :mod:`tokenmerge.algorithms.randomness`) instead of top-left.
    - merge_attn / merge_crossattn / merge_mlp: which sub-layers run on the merged tokens. ``merge_mlp=None``
      (default) is the model family's choice: off on UNets (tomesd's default), on for transformers (SD3, Flux,
      PixArt), whose MLPs cost more than their attention at most sizes.
    - seed: seed of the random partition, any int (all its bits count). ``None`` means 0.
    - method: ``"tome"`` (token merging), ``"todo"`` (token downsampling, arXiv 2402.13573: queries keep
      every token, self-attention keys and values come from a copy of the image tokens downsampled by
      ``kv_factor`` (an int: each spatial side, frames kept; or ``(t, h, w)``: frames too, on video; on an
      image the last two) with ``kv_interpolation``; ``ratio``, ``sx``, ``sy``, ``use_rand``, ``seed`` and the
      ``merge_*`` options do not apply), or ``"auto"`` (token downsampling with a factor picked per block
      from its token grid: see :func:`tokenmerge.planning.auto_kv_factors`).
    - auto_max_keys, auto_min_tokens: method auto's key budget per self-attention (per frame on a video; lower is faster and
      coarser) and the grid size up to which a block is left alone.
    - auto_max_factor: method auto's largest factor per side (default 3; ``None``: no cap, the budget alone
      decides). With auto's ``max_noise`` it keeps ToMe r=0.5's quality at 2048 px strengths on the reference
      models, where the budget's own factors (6 on Flux, 12 on SD 1.5) lose it.
    - share_plan: one matching per level and call, computed in the level's first block and reused by the
      others (ToMe; changes the result, saves the matching of every other block).
    - reuse_steps: reuse a block's matching for this many consecutive denoising steps (ToMe; 1 = match at
      every step, as tomesd). Steps are counted per thread by changes of the timestep.
    - match_dtype: dtype of the similarity matmul (``None`` = the tokens' dtype, as tomesd): a name or a torch dtype
      (kept as its name).
    - recompute, refresh_every, full_steps: method tokencache's fraction of each sample's image tokens a cached step
      recomputes (1: every token, the identity), the steps between two full steps after the first ``full_steps``
      full ones (every token is then at most ``refresh_every - 1`` steps stale), and those first full steps.
      Defaults 0.1 / 6 / 3, from the reference models' frontier (docs/tokencache.md): on the transformers 2.8x less
      work than vanilla at 10-12 dB above ToMe r=0.5.
    - cache_dtype: how method tokencache keeps its cached outputs, keys and values: ``"int8"`` (default: a scale per
      token and group of 64 channels, a little over half of bfloat16's bytes), ``"int4"``, ``"bfloat16"``,
      ``"float16"``, ``"float32"`` (or those torch dtypes), or ``None``: the model's own dtype, exact
      (docs/tokencache.md#memory).
    - memory: method tokencache's memory setting: ``"default"`` (``cache_dtype``), or ``"low"``: every cache as int4
      (a scale per token and 128 channels), the block inputs it measures changes against as int8; about a quarter of
      the memory of caches kept in bfloat16, 0.7-1.1 dB below int8 on the reference models.
    - max_noise: reduce only in the denoising steps whose noise level is at most this (the timestep as a fraction
      of the model's range: 1 = pure noise, 0 = clean); the noisier steps run unchanged. ``None`` (default) is the
      method's own: 0.4 for ``auto`` (:data:`AUTO_MAX_NOISE`), 1 (every step, as tomesd) for ``tome`` and ``todo``.
      A reduction in the high-noise steps moves the whole image's layout, one in the low-noise steps only its
      detail: on the reference models ``auto`` at 0.4 keeps more than ToMe r=0.5 on every yardstick, every step
      loses to it (docs/quality.md#a-noise-schedule-max_noise); ``max_noise=1`` is auto's speed-first setting. Read
      once per call (one host read of the timestep); under ``torch.compile`` of the whole denoiser it cannot be read
      and every step is reduced (compile the blocks, ``compile_repeated_blocks``, to keep it).
    """

    ratio: float = 0.5
    max_downsample: int | None = None
    sx: int = 2
    sy: int = 2
    st: int = 1
    use_rand: bool = True
    merge_attn: bool = True
    merge_crossattn: bool = False
    merge_mlp: bool | None = None
    seed: int | None = None
    method: str = "tome"
    kv_factor: int | tuple[int, int, int] = 2
    kv_interpolation: str = "nearest-exact"
    auto_max_keys: int = 512
    auto_min_tokens: int = 1024
    auto_max_factor: int | None = 3
    share_plan: bool = False
    reuse_steps: int = 1
    match_dtype: str | None = None
    max_noise: float | None = None
    recompute: float = 0.1
    refresh_every: int = 6
    full_steps: int = 3
    cache_dtype: str | None = DEFAULT_CACHE_DTYPE
    memory: str = "default"

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        ratio = _as_real("ratio", self.ratio, "a number in [0, 1)")
        if math.isnan(ratio) or not 0 <= ratio < 1:
            raise ValueError(f"ratio must be a number in [0, 1), got {self.ratio!r}")
        put("ratio", ratio)
        put("kv_factor", _as_factor(self.kv_factor))
        if self.auto_max_factor is not None:
            cap = _as_int("auto_max_factor", self.auto_max_factor, "None or an int >= 2")
            if cap < 2:
                raise ValueError(f"auto_max_factor must be None or an int >= 2, got {cap!r}")
            put("auto_max_factor", cap)
        if self.max_noise is not None:
            noise = _as_real("max_noise", self.max_noise, "None or a number in (0, 1]")
            if math.isnan(noise) or not 0 < noise <= 1:
                raise ValueError(f"max_noise must be None or a number in (0, 1], got {self.max_noise!r}")
            put("max_noise", noise)
        recompute = _as_real("recompute", self.recompute, "a number in (0, 1]")
        if math.isnan(recompute) or not 0 < recompute <= 1:
            raise ValueError(f"recompute must be a number in (0, 1], got {self.recompute!r}")
        put("recompute", recompute)
        full_steps = _as_int("full_steps", self.full_steps, "an int >= 0")
        if full_steps < 0:
            raise ValueError(f"full_steps must be an int >= 0, got {full_steps!r}")
        put("full_steps", full_steps)
        for name in ("sx", "sy", "st", "reuse_steps", "auto_max_keys", "auto_min_tokens", "refresh_every"):
            value = _as_int(name, getattr(self, name), "an int >= 1")
            if value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
            put(name, value)
        if self.max_downsample is not None:
            allowed = "None (auto) or a power of two such as 1, 2, 4 or 8"
            md = _as_int("max_downsample", self.max_downsample, allowed)
            if md < 1 or md & (md - 1):
                raise ValueError(f"max_downsample must be {allowed}, got {md!r}")
            put("max_downsample", md)
        for name in ("use_rand", "merge_attn", "merge_crossattn", "merge_mlp", "share_plan"):
            if name != "merge_mlp" or self.merge_mlp is not None:
                put(name, _as_bool(name, getattr(self, name)))
        if self.seed is not None:
            put("seed", _as_int("seed", self.seed, "None or an int"))
        _as_choice("method", self.method, METHODS)
        _as_choice("kv_interpolation", self.kv_interpolation, KV_INTERPOLATIONS)
        match_dtype = self.match_dtype
        if type(match_dtype).__name__ == "dtype":  # torch.bfloat16 as well as "bfloat16"
            match_dtype = str(match_dtype).removeprefix("torch.")
        put("match_dtype", _as_choice("match_dtype", match_dtype, MATCH_DTYPES, none=True))
        cache_dtype = self.cache_dtype
        if type(cache_dtype).__name__ == "dtype":
            cache_dtype = str(cache_dtype).removeprefix("torch.")
        put("cache_dtype", _as_choice("cache_dtype", cache_dtype, CACHE_DTYPES, none=True))
        _as_choice("memory", self.memory, MEMORY)
        if self.memory == "low" and self.cache_dtype not in (DEFAULT_CACHE_DTYPE, "int4"):
            raise ValueError(
                f"memory='low' keeps the token cache as int4; cache_dtype={self.cache_dtype!r} asks otherwise: leave "
                "cache_dtype at its default with memory='low', or set memory='default'"
            )

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
    def kept_as(self) -> str | None:
        """How method tokencache keeps its caches: ``cache_dtype``, int4 under ``memory="low"``."""
        return "int4" if self.memory == "low" else self.cache_dtype

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

    def replace(self, **changes: Any) -> TokenMergeConfig:
        check_option_names(changes)
        return dataclasses.replace(self, **changes)


OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TokenMergeConfig))


def ignored_by(method: str) -> tuple[str, ...]:
    """The options ``method`` does not read."""
    reads = methods.get(method).reads
    return tuple(name for name in OPTION_NAMES if name not in COMMON and name not in reads)


DEFAULTS = TokenMergeConfig()
# tomesd 0.1.3's positional parameters, in its order; every other option is keyword-only.
TOMESD_PARAMETERS = ("ratio", "max_downsample", "sx", "sy", "use_rand", "merge_attn", "merge_crossattn", "merge_mlp")


def check_option_names(options: dict[str, Any]) -> None:
    """Reject unknown keywords with the list of valid ones (a typo must not be ignored)."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; valid options are: {', '.join(OPTION_NAMES)}")
