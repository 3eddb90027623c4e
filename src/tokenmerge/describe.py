"""``tokenmerge.describe(model)``: what a patch does, block by block, in a readable form.

At a size (``grid=`` in tokens, or ``size=`` in pixels with ``frames=`` on video, converted per family) it says
what each block does there; for a pipeline with ``steps=``, how many of the steps its scheduler will run the noise
gate (``max_noise``) reduces, per denoiser (Wan 2.2's two experts each their own).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import torch

from .algorithms import TokenGrid
from .config import TokenMergeConfig
from .families import discover, get
from .families.base import config_int, has_class_named
from .hooks import PatchState
from .methods import BlockFacts
from .planning import decide, gated
from .schedules import expert_steps, noise_of, pipeline_timesteps
from .steps import FEW_STEPS, StepPosition, counts_steps

# Token grid sides beyond this are pixel or latent sizes passed as a grid (4096 px is 512 latent cells on SD).
MAX_GRID_SIDE = 512


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
    component: str = ""  # where it sits in the model ("transformer", "transformer_2", "controlnet", ...)
    grid: TokenGrid | None = None  # the top-level token grid described, if any
    steps: str = ""  # what the noise gate does with the pipeline's steps, if asked
    cache: str = ""  # what a per-generation method holds in this thread, if anything

    @property
    def patched_blocks(self) -> tuple[BlockDescription, ...]:
        return tuple(b for b in self.blocks if b.patched)

    def __str__(self) -> str:
        where = f"{self.component}: " if self.component else ""
        header = (
            f"{where}{self.name} ({self.family}): {len(self.patched_blocks)} of {len(self.blocks)} blocks patched, "
            f"method={self.config.method}"
        )
        if self.grid is not None:
            header += f", at a {self.grid} token grid"
        if self.config.noise_limit < 1 and not self.config.is_identity:
            header += f", in the steps at noise level <= {self.config.noise_limit:g} (1 = pure noise; the others run unchanged)"
        lines = [header] + ([f"  steps: {self.steps}"] if self.steps else []) + ([f"  cache: {self.cache}"] if self.cache else [])
        return "\n".join(lines + list(map(str, self.blocks)))


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


def _action(config: TokenMergeConfig, info: Any, spans: tuple[str, ...], top_level: int, grid: TokenGrid | None) -> str:
    """What a block (``info``) does, as :func:`tokenmerge.planning.decide` decides it at ``grid`` (its level's part of
    it)."""
    method, level = config.method_of, info.level
    if grid is None:
        return "unchanged (identity options)" if config.is_identity else method.describe(config, None, None, spans)
    at = grid.scaled(level)
    declared = {} if info.layout.output is None else {"around_block": None}  # (its calls' arguments aside)
    action = decide(config, BlockFacts(level=level, top_level=top_level, grid=at, **declared))
    if action.reason == "identity options":
        return "unchanged (identity options)"
    return method.describe(config, action, at, spans)


def _grid_of(grid: Any) -> TokenGrid | None:
    """``grid=`` checked: a token grid, (h, w) or (frames, h, w) tokens."""
    if grid is None:
        return None
    allowed = "a token grid: (h, w) or (frames, h, w) tokens, or a tokenmerge TokenGrid (for an image size in pixels, use size=)"
    if isinstance(grid, TokenGrid):
        sides = grid.shape
    elif isinstance(grid, (tuple, list)) and 1 <= len(grid) <= 3 and all(isinstance(v, numbers.Integral) and v > 0 for v in grid):
        sides = tuple(int(v) for v in grid)
    else:
        raise TypeError(f"grid must be {allowed}, got {grid!r}")
    if max(sides[-2:]) > MAX_GRID_SIDE:
        raise ValueError(
            f"grid={grid!r} has a side of more than {MAX_GRID_SIDE} tokens: a size in pixels or latent cells? grid is in "
            "tokens (Flux at 1024 px: (64, 64)); describe(model, size=1024) converts pixels per family"
        )
    return TokenGrid(sides)


def _size_of(size: Any) -> tuple[int, int] | None:
    if size is None:
        return None
    if isinstance(size, numbers.Integral) and size > 0:
        return int(size), int(size)
    if isinstance(size, (tuple, list)) and len(size) == 2 and all(isinstance(v, numbers.Integral) and v > 0 for v in size):
        return int(size[0]), int(size[1])
    raise TypeError(f"size must be an image size in pixels: an int or (height, width), got {size!r}")


def pixels_to_grid(root: torch.nn.Module, family: str, size: tuple[int, int], frames: int | None) -> TokenGrid:
    """The top-level token grid of an image of ``size`` px (and ``frames`` video frames) on ``root``, as its family's
    pipelines encode and patch it."""
    found = get(family)
    px, stride = found.pixels(root)
    h, w = size[0] // px, size[1] // px
    if not found.video:
        return TokenGrid((h, w))
    if frames is None:
        raise ValueError(f"the {found.title} {type(root).__name__} is a video model: give frames= (video frames) with size=")
    latent = (frames - 1) // stride + 1
    return TokenGrid((math.ceil(latent / config_int(root, "patch_size_t", 1)), h, w))


def _steps(pipe: Any, component: str, config: TokenMergeConfig, steps: int, grid: TokenGrid) -> str:
    """What the noise gate does with ``component``'s share of a ``steps``-step generation of ``pipe``."""
    timesteps = pipeline_timesteps(pipe, steps, grid.numel)
    runs = expert_steps(pipe, component, timesteps)
    positions = [StepPosition(i, len(timesteps)) for i in range(len(timesteps))]
    reduced = [i for i in runs if not gated(config, noise_of(pipe, timesteps[i]), positions[i])]
    share = f"runs {len(runs)} of the {len(timesteps)} steps; " if len(runs) != len(timesteps) else ""
    acting = config.method_of.acting_steps(config, len(timesteps))
    if acting is not None:  # a method acting on some steps only (a step cache of tokens: its cached steps)
        cached = [i for i in reduced if i in acting]
        if not cached:
            return f"{share}caches 0 of {len(runs)}: all are computed fully"
        return f"{share}caches {len(cached)} of {len(runs)} (from step {cached[0] + 1} on); the others are computed fully"
    if len(reduced) == len(runs):
        return f"{share}reduces all {len(runs)}"
    above = f"at noise above max_noise={config.noise_limit:g}"
    if counts_steps(config, positions[0]):  # the few-step rule: the last share of the steps
        above = f"before the last {config.few_step_share:.0%} of a few-step schedule (at most {FEW_STEPS} steps)"
    if not reduced:
        return f"{share}reduces 0 of {len(runs)}: all {above}"
    which = f"step {reduced[0] + 1}" if len(reduced) == 1 else f"steps {reduced[0] + 1}-{reduced[-1] + 1}"
    return f"{share}reduces {len(reduced)} of {len(runs)} ({which}); the others are {above}"


def _describe(patch: PatchState, grid: TokenGrid | None, component: str, steps: str) -> DenoiserDescription:
    config, layout = patch.config, patch.layout
    every = config.method_of.every_span
    enabled = {name for name in ("merge_attn", "merge_crossattn", "merge_mlp") if every or config.merges(name, layout.single_level)}
    blocks = []
    for info in patch.blocks:
        spans = tuple(s.name for s in info.layout.spans if s.option in enabled)
        patched = not config.is_identity and config.merges_level(info.level, layout.top_level)
        action = _action(config, info, spans, layout.top_level, grid) if patched else "unchanged (level not patched)"
        blocks.append(BlockDescription(info.index, info.layout.kind, info.level, spans, patched, action))
    family = get(layout.family).title
    cache = config.method_of.held(patch.generations()) if config.method_of.per_generation else ""
    return DenoiserDescription(type(layout.root).__name__, family, layout.top_level, config, tuple(blocks), component, grid, steps, cache)


def describe(
    model: Any,
    grid: TokenGrid | tuple[int, ...] | None = None,
    *,
    size: int | tuple[int, int] | None = None,
    frames: int | None = None,
    steps: int | None = None,
) -> PatchDescription:
    """Which blocks a patch reaches and what each does.

    ``grid``: the token grid of the highest-resolution level (a UNet's latent (h, w), a transformer's patch grid,
    (frames, h, w) on video), or ``size``: the image size in pixels (an int or (height, width)), with ``frames`` (video
    frames) on video models, converted per family (SD: /8; most transformers: /16; Wan, HunyuanVideo: frames
    (n - 1) / 4 + 1): what each block does there. ``steps`` (a pipeline, with ``size``): how many of the steps its
    scheduler runs at that size the noise gate reduces, per denoiser (Wan 2.2's experts each their share)."""
    from .patch import named_states

    if grid is not None and size is not None:
        raise TypeError("pass grid= (tokens) or size= (pixels), not both")
    given, pixels = _grid_of(grid), _size_of(size)
    if steps is not None:
        if not has_class_named(model, "DiffusionPipeline") or getattr(model, "scheduler", None) is None:
            raise TypeError(f"steps= counts the steps of a pipeline's scheduler; {type(model).__name__} is not a diffusers pipeline")
        if pixels is None and given is None:
            raise TypeError("steps= needs the image size (size=, in pixels): flow pipelines shift their schedules by it")
        if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
            raise TypeError(f"steps must be an int >= 1, got {steps!r}")
    states = named_states(model)
    if not states:
        try:
            discover(model)
        except TypeError as error:
            return PatchDescription((), unsupported=str(error))
    found = []
    for component, patch in states:
        at = given if pixels is None else pixels_to_grid(patch.layout.root, patch.layout.family, pixels, frames)
        counted = _steps(model, component.split(".")[0], patch.config, int(steps), at) if steps is not None else ""
        found.append(_describe(patch, at, component, counted))
    return PatchDescription(tuple(found))
