"""``method="todo"``: token downsampling (ToDo, arXiv 2402.13573). Every query is kept; the image keys and values of
self- and joint attention come from a copy of the image tokens downsampled by ``kv_factor`` (each spatial side, or
(t, h, w) on video) with ``kv_interpolation``. No matching, no unmerge."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..algorithms import TokenGrid
from ..options import Option
from .keys import KeyValueMethod

if TYPE_CHECKING:
    from ..config import TokenMergeConfig


class ToDo(KeyValueMethod):
    name = "todo"
    summary = "downsamples keys and values"
    primary = "kv_factor"
    options = (
        Option(
            "kv_factor",
            "factor",
            2,
            "key/value downsampling factor per side (or (t, h, w) on a video)",
            low=1,
            widget_max=8,
            advanced=False,
        ),
        Option(
            "kv_interpolation",
            "choice",
            "nearest-exact",
            "how keys and values are downsampled (todo, auto)",
            choices=("nearest-exact", "nearest", "bilinear", "bicubic", "area"),
            advanced=False,
        ),
    )

    def is_identity(self, config: TokenMergeConfig) -> bool:
        return config.kv_factor in (1, (1, 1, 1))

    def factors(self, config: TokenMergeConfig, grid: TokenGrid) -> tuple[int, ...]:
        return config.kv_factors(grid.rank)

    def frame_option(self, config: TokenMergeConfig) -> tuple[str, str] | None:
        if isinstance(config.kv_factor, tuple) and config.kv_factor[0] > 1:
            h, w = config.kv_factor[1:]
            return f"kv_factor={config.kv_factor}", f"a factor of {h} on the height and {w} on the width"
        return None
