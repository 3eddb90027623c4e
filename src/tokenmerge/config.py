"""The validated option set of one patch.

Arguments are checked once, here, so the hot path (hooks run for every block at every step) can trust
them. Every error names the argument and the values it accepts.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Any


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


METHODS = ("tome", "todo", "auto")
MATCH_DTYPES = ("float32", "float16", "bfloat16")
KV_INTERPOLATIONS = ("nearest-exact", "nearest", "bilinear", "bicubic", "area")


@dataclass(frozen=True)
class TokenMergeConfig:
    """Options of ToMe for SD, with tomesd 0.1.3's names and defaults (except ``max_downsample``).

    - ratio: fraction of a block's tokens merged away, in [0, 1). At most ``1 - 1/(sx*sy)`` can be
      reached (one destination token is kept per sx×sy window); more is clamped with a warning.
    - max_downsample: merge only in blocks whose latent is downsampled at most this much (1, 2, 4,
      8, ...). ``None`` means the highest-resolution level that has attention: 1 on SD 1.x/2.x, 2 on
      SDXL (whose top level has no attention, so tomesd's default of 1 does nothing there).
    - sx, sy: window of the destination grid, in tokens.
    - use_rand: pick the destination token of each window at random (derived from ``seed``, the
      block and the timestep; see ``tokenmerge.matching.random_partition``) instead of top-left.
    - merge_attn / merge_crossattn / merge_mlp: which sub-layers run on the merged tokens.
    - seed: seed of the random partition. ``None`` means 0: results never depend on earlier calls.
    - method: ``"tome"`` (token merging, the default) or ``"todo"`` (token downsampling, arXiv
      2402.13573: queries keep every token, self-attention keys and values come from a copy of the
      tokens downsampled by ``kv_factor`` with ``kv_interpolation``; no matching, no unmerge;
      ``ratio``, ``sx``, ``sy``, ``use_rand``, ``seed`` and the ``merge_*`` options do not apply), or
      ``"auto"`` (token downsampling with a factor picked per block from its token count, on every level
      up to ``max_downsample``: grids of at most ``auto_min_tokens`` tokens are left alone, larger ones
      get the smallest integer factor that leaves at most ``auto_max_keys`` keys; see
      :func:`tokenmerge.planning.auto_kv_factor`).
    - auto_max_keys, auto_min_tokens: method auto's key budget per self-attention (lower is faster and
      coarser) and the grid size below which a block is left alone.
    - share_plan: one matching per level and call, computed in the level's first block and reused by
      the others (ToMe; changes the result, saves the matching of every other block).
    - reuse_steps: reuse a block's matching for this many consecutive denoising steps (ToMe; 1 = match
      at every step, tomesd's behaviour). Steps are counted by changes of the timestep, so results then
      depend on the calls before: :func:`tokenmerge.apply_patch` or ``update_options`` starts afresh.
    - match_dtype: dtype of the similarity matmul (``None`` = the tokens' dtype, as tomesd). On CPUs with
      bf16 matrix units ``"bfloat16"`` makes the matching ~2-3x cheaper; near-ties may then pair differently.
    """

    ratio: float = 0.5
    max_downsample: int | None = None
    sx: int = 2
    sy: int = 2
    use_rand: bool = True
    merge_attn: bool = True
    merge_crossattn: bool = False
    merge_mlp: bool = False
    seed: int | None = None
    method: str = "tome"
    kv_factor: int = 2
    kv_interpolation: str = "nearest-exact"
    auto_max_keys: int = 512
    auto_min_tokens: int = 1024
    share_plan: bool = False
    reuse_steps: int = 1
    match_dtype: str | None = None

    def __post_init__(self) -> None:
        ratio = self.ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
            raise TypeError(f"ratio must be a number in [0, 1), got {ratio!r}")
        if math.isnan(ratio) or not 0 <= ratio < 1:
            raise ValueError(f"ratio must be a number in [0, 1), got {ratio!r}")
        object.__setattr__(self, "ratio", float(ratio))
        _check_positive_int("sx", self.sx)
        _check_positive_int("sy", self.sy)
        md = self.max_downsample
        if md is not None:
            if isinstance(md, bool) or not isinstance(md, int) or md < 1 or md & (md - 1):
                raise ValueError(
                    f"max_downsample must be None (auto) or a power of two such as 1, 2, 4 or 8, got {md!r}"
                )
        for name in ("use_rand", "merge_attn", "merge_crossattn", "merge_mlp", "share_plan"):
            _check_bool(name, getattr(self, name))
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise TypeError(f"seed must be None or an int, got {self.seed!r}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        _check_positive_int("kv_factor", self.kv_factor)
        if self.kv_interpolation not in KV_INTERPOLATIONS:
            raise ValueError(f"kv_interpolation must be one of {', '.join(KV_INTERPOLATIONS)}, got {self.kv_interpolation!r}")
        _check_positive_int("reuse_steps", self.reuse_steps)
        _check_positive_int("auto_max_keys", self.auto_max_keys)
        _check_positive_int("auto_min_tokens", self.auto_min_tokens)
        if self.match_dtype is not None and self.match_dtype not in MATCH_DTYPES:
            raise ValueError(f"match_dtype must be None or one of {', '.join(MATCH_DTYPES)}, got {self.match_dtype!r}")

    @property
    def max_ratio(self) -> float:
        """The largest ratio the sx×sy destination grid can reach: all but one token per window."""
        return 1.0 - 1.0 / (self.sx * self.sy)

    def warn_if_capped(self, stacklevel: int = 3) -> None:
        """Warn (never cap silently) when ``ratio`` exceeds what the destination grid can reach."""
        if self.method == "tome" and self.ratio > self.max_ratio:
            warnings.warn(
                f"tokenmerge: ratio={self.ratio} exceeds the reachable maximum 1 - 1/(sx*sy) = {self.max_ratio:g} "
                f"for sx={self.sx}, sy={self.sy}; the effective ratio is {self.max_ratio:g}",
                stacklevel=stacklevel,
            )

    @property
    def is_identity(self) -> bool:
        """True when these options leave every block unchanged (ratio 0 for tome, factor 1 for todo)."""
        if self.method == "auto":
            return False
        return self.ratio == 0 if self.method == "tome" else self.kv_factor == 1

    def merge_level(self, top_level: int) -> int:
        """The lowest resolution (largest downsampling factor) patched: ``max_downsample``, else
        ``top_level`` (the model's highest-resolution level with attention) for tome/todo, and every
        level for auto, whose per-block rule leaves small grids alone."""
        if self.max_downsample is not None:
            return self.max_downsample
        return 1 << 30 if self.method == "auto" else top_level

    @property
    def effective_seed(self) -> int:
        return 0 if self.seed is None else self.seed

    def replace(self, **changes: Any) -> TokenMergeConfig:
        check_option_names(changes)
        return dataclasses.replace(self, **changes)


OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TokenMergeConfig))


def check_option_names(options: dict[str, Any]) -> None:
    """Reject unknown keywords with the list of valid ones (a typo must not be ignored)."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; valid options are: {', '.join(OPTION_NAMES)}")
