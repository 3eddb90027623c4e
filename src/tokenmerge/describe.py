"""``tokenmerge.describe(model)``: what a patch does, block by block, in a readable form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .algorithms import TokenGrid
from .config import TokenMergeConfig
from .families import discover, get, roots_of
from .hooks import PatchState, states_in
from .planning import BlockAction, kv_factors_for, merge_count


@dataclass(frozen=True)
class BlockDescription:
    index: int
    kind: str  # the block's class
    level: int  # downsampling factor of its token grid (1: the highest resolution)
    spans: tuple[str, ...]  # merged stretches: "attn1", "ff", "attn+mlp", ...
    patched: bool  # whether the options reach this block's level
    action: str  # what it does (for a given grid, if one was given)

    def __str__(self) -> str:
        return f"  block {self.index:>3}  {self.kind:<28} level {self.level:<3} {self.action}"


@dataclass(frozen=True)
class DenoiserDescription:
    name: str  # the denoiser's class
    family: str
    top_level: int
    config: TokenMergeConfig
    blocks: tuple[BlockDescription, ...]

    @property
    def patched_blocks(self) -> tuple[BlockDescription, ...]:
        return tuple(b for b in self.blocks if b.patched)

    def __str__(self) -> str:
        header = (
            f"{self.name} ({self.family}): {len(self.patched_blocks)} of {len(self.blocks)} blocks patched, method={self.config.method}"
        )
        if self.config.noise_limit < 1 and not self.config.is_identity:
            header += f", in the steps at noise level <= {self.config.noise_limit:g} (1 = pure noise; the others run unchanged)"
        return "\n".join([header, *map(str, self.blocks)])


@dataclass(frozen=True)
class PatchDescription:
    denoisers: tuple[DenoiserDescription, ...]
    unsupported: str | None = None  # why tokenmerge cannot patch the model, when it is not patched for that reason

    @property
    def config(self) -> TokenMergeConfig | None:
        return self.denoisers[0].config if self.denoisers else None

    def __str__(self) -> str:
        if self.denoisers:
            return "\n".join(map(str, self.denoisers))
        return f"not supported by tokenmerge: {self.unsupported}" if self.unsupported else "not patched by tokenmerge"

    __repr__ = __str__


def _action(config: TokenMergeConfig, spans: tuple[str, ...], level: int, grid: TokenGrid | None) -> str:
    if config.is_identity:
        return "unchanged (identity options)"
    if grid is None:
        what = "merge tokens" if config.method == "tome" else "downsample keys/values"
        return f"{what} ({', '.join(spans) if config.method == 'tome' else config.method})"
    grid = grid.scaled(level)
    n = grid.numel
    if config.method == "tome":
        r = merge_count(config, grid)
        return f"merge {r} of {n} tokens ({grid}) in {', '.join(spans)}" if r > 0 else f"unchanged ({grid} grid too small)"
    factors = kv_factors_for(config, grid)
    if max(factors) == 1:
        return f"unchanged ({n} tokens: at most auto_min_tokens)" if config.method == "auto" else "unchanged"
    kept = grid.reduced(factors)
    return f"keys/values {n} -> {kept.numel} (factor {BlockAction(kv_grid=grid, kv_factors=factors).kv_label}, {grid} -> {kept})"


def _describe(patch: PatchState, grid: TokenGrid | None) -> DenoiserDescription:
    config, layout = patch.config, patch.layout
    enabled = {name for name in ("merge_attn", "merge_crossattn", "merge_mlp") if config.merges(name, layout.single_level)}
    blocks = []
    for info in patch.blocks:
        spans = tuple(s.name for s in info.layout.spans if s.option in enabled)
        patched = not config.is_identity and config.merges_level(info.level, layout.top_level)
        action = _action(config, spans, info.level, grid) if patched else "unchanged (level not patched)"
        blocks.append(BlockDescription(info.index, info.layout.kind, info.level, spans, patched, action))
    return DenoiserDescription(type(layout.root).__name__, get(layout.family).title, layout.top_level, config, tuple(blocks))


def describe(model: Any, grid: TokenGrid | tuple[int, ...] | None = None) -> PatchDescription:
    """Which blocks a patch reaches and what each does; with ``grid`` (the token grid of the highest-resolution
    level: the latent's (h, w) for a UNet, the patch grid for a transformer, (frames, h, w) for a video one), what
    each does at that size."""
    found = None if grid is None else TokenGrid.of(grid)
    states = states_in(roots_of(model))
    if not states:
        try:
            discover(model)
        except TypeError as error:
            return PatchDescription((), unsupported=str(error))
    return PatchDescription(tuple(_describe(patch, found) for _, patch in states))
