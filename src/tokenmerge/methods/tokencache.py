"""``method="tokencache"``: token-wise caching across steps (in the spirit of ToCa, ICLR 2025, written from its paper).

Every span of a patched block (an attention, a cross-attention, an MLP, Flux's parallel attention + MLP) keeps, per
sample and image token, its output at the step that last computed that token; a block whose family declares it
(:class:`tokenmerge.families.base.BlockOutput`: Wan's) runs whole on the recomputed tokens and keeps one residual per
token instead (its output less its input), each other token its input plus that residual. A step computes fully (and records
every output) in a generation's first ``full_steps`` steps and every ``refresh_every``-th step after them; the steps
between recompute a fraction ``recompute`` of each sample's image tokens and give the others their cached outputs.
Which tokens: the token grid (row-major) is cut into windows of ``round(1 / recompute)`` tokens and each window
recomputes the token whose block input moved most since it was last computed (relative to its size), so the
recomputed tokens are spread over the image and a window's stalest change comes first; text and reference tokens
are always computed. The recomputed queries attend to the keys and values of every token: fresh for the recomputed
ones, the cached keys and values (after the rotary embedding) of the last full step for the others; where a plain
self-attention takes its keys from a keyword (a UNet's ``attn1``), every token's keys and values are projected
fresh instead (exact).

State belongs to one generation: a sequence of calls of one patched model in one thread (:class:`Generations`:
classifier-free guidance's halves called apart have a slot each, a batch's samples their rows). Where the front end
knows the generation (a diffusers pipeline's schedule, ComfyUI's sampling run, the webui's step count,
:func:`tokenmerge.generation`) it begins and ends with it, whatever ends it (an exception, an interrupt); its last
step records nothing and frees what was held. Elsewhere a generation starts afresh when a slot's noise level does not
fall (a new generation), or the grid, batch or dtype changes, and at most :data:`MAX_SLOTS` are kept.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..algorithms import AROUND_BLOCK, Shard, TokenGrid
from ..algorithms.stores import CACHE_DTYPES, RowStore, store
from ..options import Option
from ..steps import FEW_STEPS
from .base import BlockAction, BlockFacts, Method, idle

if TYPE_CHECKING:
    from ..config import TokenMergeConfig


# An attention's (B, H, S, D) keys and values as kept: the whole sequence and where its image starts, or (kept in another
# dtype than the model's) the image rows only, with None.
KeyValues = tuple[RowStore, RowStore, int | None]


@dataclass
class Generation:
    """The caches of one generation (one slot of one thread): per grid, the block input each image token had when it
    was last computed; per (block, span), each image token's output; per (block, attention site), the keys and
    values of the attention's whole sequence (an image token's: of its last computation); and what this call does."""

    key: tuple  # (batch, dtype, device): another starts a new generation
    noise: float | None = None  # the last call's noise level
    steps: int = 0  # the calls of this generation whose blocks ran (a step a step cache skipped does not count)
    ran: bool = False  # a block of the current call acted
    inputs: dict[tuple, RowStore] = field(default_factory=dict)  # grid shape -> (B, N, C)
    outputs: dict[tuple, RowStore] = field(default_factory=dict)  # (block, span) -> (B, N, C')
    keys: dict[tuple, KeyValues] = field(default_factory=dict)  # (block, site) -> its keys, values, image start
    full: bool = True  # this call computes every token
    final: bool = False  # this call is the last step of its generation's known schedule: nothing is recorded
    schedule: int | None = None  # the steps of its schedule, where the front end knows them
    cache_dtype: str | None = None  # how its caches are kept (the option cache_dtype)
    selections: dict[tuple, torch.Tensor] = field(default_factory=dict)  # grid shape -> (B, k) this call's tokens
    forecast: float = 0.0  # how far the cached outputs move on (the option forecast)
    slopes: dict[tuple, RowStore] = field(default_factory=dict)  # (block, span) -> each token's output change per step
    ages: dict[tuple, torch.Tensor] = field(default_factory=dict)  # grid shape -> (B, N) steps since each token was computed
    gaps: dict[tuple, torch.Tensor] = field(default_factory=dict)  # grid shape -> (B, N) the same, before this step

    @property
    def nbytes(self) -> int:
        return sum(self.block_bytes().values())

    def block_bytes(self) -> dict[int | None, int]:
        """Bytes held per block (None: the recorded block inputs, one per grid)."""
        held: dict[int | None, int] = {None: sum(t.nbytes for t in self.inputs.values())}
        for (block, _), t in [*self.outputs.items(), *self.slopes.items()]:
            held[block] = held.get(block, 0) + t.nbytes
        for (block, _), (k, v, _) in self.keys.items():
            held[block] = held.get(block, 0) + k.nbytes + v.nbytes
        return held


# Slots a thread keeps (the calls made at one timestep: classifier-free guidance's halves called apart, a second-order
# sampler's second evaluation): a call beyond them at the same timestep starts a new generation in the first slot, so
# a loop of one-step generations that no front end scopes holds at most this many.
MAX_SLOTS = 4


class Generations:
    """A patch's generations in one thread: one per slot (the calls made at one timestep: classifier-free guidance's
    conditional and unconditional halves called apart). A slot starts afresh when its call's noise level does not fall
    below the slot's last one (a new generation), or the call has another batch, dtype or device; a fresh first slot
    drops the others (they belonged to the generation before). ``marker``: what identifies the generation where the
    front end knows it (a pipeline's schedule, set anew by each of its calls): another marker starts afresh."""

    def __init__(self) -> None:
        self.slots: list[Generation] = []
        self.last: tuple[list[float] | None, int] = (None, -1)  # the last call's timestep and slot
        self.marker: Any = None

    def begin(self, timestep: list[float] | None, noise: float | None, key: tuple, marker: Any = None) -> Generation:
        if marker is not None and marker is not self.marker:
            self.clear()
            self.marker = marker
        last_t, last_slot = self.last
        slot = last_slot + 1 if timestep is not None and timestep == last_t else 0
        if slot >= MAX_SLOTS:
            slot = 0
        self.last = (timestep, slot)
        while len(self.slots) <= slot:
            self.slots.append(Generation(key))
        generation = self.slots[slot]
        if generation.key != key or (noise is not None and generation.noise is not None and noise >= generation.noise):
            if slot == 0:
                del self.slots[1:]
            generation = self.slots[slot] = Generation(key)
        generation.noise = noise
        generation.selections = {}
        return generation

    def begin_call(
        self,
        config: TokenMergeConfig,
        x: Any,
        timestep: list[float] | None,
        noise: float | None,
        marker: Any = None,
        final: bool = False,
        steps: int | None = None,
    ) -> Generation:
        """The generation a model call on ``x`` at ``timestep`` (its values, read once by the front end) belongs to,
        begun for ``config``'s method: what every front end does at the start of a call. ``final``: the call is its
        schedule's last step (nothing after it reads what it would record); ``steps``: its schedule's length, where
        the front end knows it."""
        key = (x.shape[0], x.dtype, str(x.device)) if isinstance(x, torch.Tensor) else None
        generation = self.begin(timestep, noise, key, marker)
        generation.final = final
        generation.schedule = steps if steps is not None else generation.schedule
        config.method_of.begin(config, generation)
        return generation

    def end(self, generation: Generation) -> None:
        """``generation`` is over (its schedule's last step ran): what it holds is freed."""
        for i, found in enumerate(self.slots):
            if found is generation:
                self.slots[i] = Generation(generation.key)

    def clear(self) -> None:
        """Every generation is over: what they hold is freed, the next call starts afresh."""
        self.slots = []
        self.last = (None, -1)

    @property
    def nbytes(self) -> int:
        return sum(g.nbytes for g in self.slots)


class SelectSpan:
    """The token cache's span (:class:`tokenmerge.algorithms.TokenSpan`): each sample's selected image tokens gathered,
    the span's output scattered into its cached outputs (the selected tokens' replaced), the span's attentions given
    every token's keys and values; on a full step (``index`` None) every token is kept, and its outputs, keys and
    values are recorded."""

    fills_keys = True

    def __init__(
        self,
        generation: Generation,
        block: int,
        index: torch.Tensor | None,
        n: int,
        age: torch.Tensor | None = None,
        gap: torch.Tensor | None = None,
    ) -> None:
        self.generation = generation
        # forecast: (B, N) steps since each token was last computed, after this step (0: computed now) and before it
        self.age, self.gap = age, gap
        self.block = block
        self.index = index  # (B, k) selected positions, in order; None: every token (a full step, recorded)
        self.n = n
        self.keep_idx = index if index is not None else torch.arange(n).unsqueeze(0)

    @property
    def whole(self) -> bool:
        return self.index is None

    @property
    def batch_size(self) -> int:
        return self.keep_idx.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.n

    @property
    def num_kept(self) -> int:
        return self.n if self.index is None else self.index.shape[1]

    def _expand(self, t: torch.Tensor) -> torch.Tensor:
        return self.index[..., None].expand(-1, -1, t.shape[-1])

    def gather(self, x: torch.Tensor, span: int = 0) -> torch.Tensor:
        return x if self.index is None else x.gather(1, self._expand(x))

    def scatter(self, y: torch.Tensor, span: int = 0) -> torch.Tensor:
        key, generation = (self.block, span), self.generation
        if self.index is None:
            dtype = _residual_dtype(generation.cache_dtype) if span == AROUND_BLOCK else generation.cache_dtype
            last = generation.outputs.get(key)
            if self.gap is not None and generation.full and last is not None and last.shape[:2] == y.shape[:2]:
                # each token's change per step since it was last computed: what a cached step extrapolates along
                generation.slopes[key] = store((y - last.read(y.dtype)) / self.gap[..., None].to(y.dtype), dtype)
            generation.outputs[key] = store(y, dtype)
            return y
        cache = generation.outputs[key]
        cache.thaw()
        # kept exactly, written in place (a copy of every token per span and step otherwise): the caller reads the
        # result before the next step writes into it again, and no block adds to a span's output in place
        slope = generation.slopes.get(key)
        at = self._expand(y)
        if slope is not None and self.gap is not None:  # the recomputed tokens' change per step since their last computation
            gap = self.gap.gather(1, self.index)[..., None].to(y.dtype)
            slope.write(1, at, (y - cache.rows(1, at, y.dtype)) / gap)
        held = cache.with_rows(1, at, y)
        if slope is None or self.age is None:
            return held
        age = self.age[..., None].to(y.dtype)  # (the computed rows' is 0)
        return torch.addcmul(held, slope.read(y.dtype), age, value=generation.forecast)

    def fill_keys(self, site: int, key: torch.Tensor, value: torch.Tensor, mask: Any, start: int) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """(B, H, S', D) keys and values of an attention of the span, with every image token's: the gathered tokens'
        fresh, the others' kept from their last computation (recorded on a full step); a mask over the gathered keys
        widened to every key (the others attended). Kept exactly, the cache holds the attention's whole key and value
        sequence (text too): a cached step writes its fresh rows into it in place and hands it to the attention, instead
        of copying every image token's keys twice (a scatter, a concatenation); kept in another dtype, it holds the
        image rows only, read back around the fresh text."""
        cache, n = (self.block, site), self.n
        if self.index is None:
            dtype = self.generation.cache_dtype
            if dtype is None or getattr(torch, dtype) == key.dtype:
                self.generation.keys[cache] = (RowStore(key), RowStore(value), start)
            else:
                image = [store(t[:, :, start : start + n], dtype) for t in (key, value)]
                self.generation.keys[cache] = (*image, None)
            return key, value, mask
        k = self.index.shape[1]
        *kept, was = self.generation.keys[cache]
        at = self.index[:, None, :, None].expand(-1, key.shape[1], -1, key.shape[-1])
        if was is None:
            for held in kept:
                held.thaw()
            full = [
                torch.cat([t[:, :, :start], held.with_rows(2, at, t[:, :, start : start + k]), t[:, :, start + k :]], dim=2)
                for t, held in zip((key, value), kept)
            ]
        else:
            full = self._fill_exact(cache, key, value, start, at, [held.data for held in kept], was)
        if isinstance(mask, torch.Tensor) and mask.shape[-1] == key.shape[2]:
            mask = _widen(mask, self.index, start, n)
        return full[0], full[1], mask

    def _fill_exact(
        self, cache: tuple, key: torch.Tensor, value: torch.Tensor, start: int, at: torch.Tensor, kept: list[torch.Tensor], was: int
    ) -> list[torch.Tensor]:
        """The whole-sequence key and value caches with this step's fresh rows (at ``at``) written in place."""
        k, n = self.index.shape[1], self.n
        length = (*key.shape[:2], key.shape[2] - k + n, key.shape[3])
        if kept[0].shape != length or was != start or kept[0].dtype != key.dtype or not _writable(kept[0]):
            # another text length or dtype than the full step's: only its image keys can be kept, in a new buffer
            kept = [
                torch.cat([t[:, :, :start], c[:, :, was : was + n].to(t.dtype), t[:, :, start + k :]], dim=2)
                for t, c in zip((key, value), kept)
            ]
            self.generation.keys[cache] = (RowStore(kept[0], copy=False), RowStore(kept[1], copy=False), start)
        for fresh, full in zip((key, value), kept):
            full[:, :, :start] = fresh[:, :, :start]
            full[:, :, start + n :] = fresh[:, :, start + k :]
            full[:, :, start : start + n].scatter_(2, at, fresh[:, :, start : start + k].detach())
        return kept

    def rows(self, start: int, stop: int) -> SelectSpan | None:
        return self if self.index is None else None  # (its caches hold the whole batch: not a chunk of it)


def kept_as(config: TokenMergeConfig) -> str | None:
    """How the caches are kept: ``cache_dtype``, int4 under ``memory="low"``."""
    return "int4" if config.memory == "low" else config.cache_dtype


def _input_dtype(cache_dtype: str | None) -> str | None:
    """How the block inputs that changes are measured against are kept (one per grid, not per block): as they are,
    int8 where the caches are int4 (a change is a difference of a few percent, which int4's steps would hide)."""
    return "int8" if cache_dtype == "int4" else None


def _residual_dtype(cache_dtype: str | None) -> str | None:
    """How a block's residual is kept: as the spans' outputs, but int8 where they are int4 (a residual is their sum,
    whose outlier channels int4's steps would spread over the others: measured 6 dB below int8 on the video model)."""
    return "int8" if cache_dtype == "int4" else cache_dtype


def _writable(t: torch.Tensor) -> bool:
    """Whether a cache can be written in place: not one made under ``torch.inference_mode`` when this call runs
    outside it (a generation whose calls mix the two: the cache is copied once)."""
    return not t.is_inference() or torch.is_inference_mode_enabled()


def _widen(mask: torch.Tensor, index: torch.Tensor, start: int, n: int) -> torch.Tensor:
    """A mask over the gathered keys (..., S') widened to every key (..., S): the gathered image columns at their
    positions, the other image columns attended (True, or 0 for an additive mask)."""
    k = index.shape[1]
    image = mask[..., start : start + k]
    fill = torch.ones((), dtype=torch.bool) if mask.dtype == torch.bool else torch.zeros((), dtype=mask.dtype)
    full = fill.to(mask.device).expand(*image.shape[:-1], n).clone()
    at = index.view(index.shape[0], *([1] * (mask.ndim - 2)), k).expand(*image.shape) if mask.shape[0] == index.shape[0] else None
    if at is None:  # a mask shared by the batch: a sample's columns cannot differ (the first sample's)
        at = index[0].expand(*image.shape)
    full = full.scatter(-1, at, image)
    return torch.cat([mask[..., :start], full, mask[..., start + k :]], dim=-1)


@dataclass(frozen=True)
class Settings:
    """What a cached step does: the options ``recompute``, ``refresh_every``, ``full_steps`` and ``forecast``."""

    recompute: float
    refresh_every: int
    full_steps: int
    forecast: float

    def __str__(self) -> str:
        return f"recompute={self.recompute:g}, refresh_every={self.refresh_every}, full_steps={self.full_steps}, forecast={self.forecast:g}"


# The presets (the option preset), each a point of the frontier measured on the reference models (docs/tokencache.md):
# quality, 2.8x less work, the closest to vanilla at that work; fast, 5.3x, still above ToMe r=0.5 on every seed.
PRESETS = {"quality": Settings(0.1, 6, 3, 0.0), "fast": Settings(0.05, 14, 2, 0.0)}
# On a known schedule of at most FEW_STEPS steps (a distilled model's) where neither full_steps nor refresh_every is
# given: the first step computed fully and every later one cached (full_steps 0, refresh_every the schedule's length:
# step 0 is the one refresh), recomputing
# this share (docs/few_steps.md, measured on the 4-step yardstick).
FEW_STEP_RECOMPUTE = {"quality": 0.25, "fast": 0.1}


@functools.lru_cache(maxsize=64)
def settings(config: TokenMergeConfig, steps: int | None = None) -> Settings:
    """The settings in force on a schedule of ``steps`` steps (None: not known): each option that is given, else its
    preset's, or on a few-step schedule its few-step rule's."""
    preset = PRESETS[config.preset]
    if steps is not None and steps <= FEW_STEPS and config.full_steps is None and config.refresh_every is None:
        preset = Settings(FEW_STEP_RECOMPUTE[config.preset], steps, 0, preset.forecast)
    return Settings(*(getattr(preset, name) if getattr(config, name) is None else getattr(config, name) for name in SETTINGS))


SETTINGS = tuple(f.name for f in dataclasses.fields(Settings))


def _preset_values(name: str) -> str:
    """What None means for option ``name``: each preset's value."""
    return "the preset's: " + ", ".join(f"{getattr(s, name):g} ({preset})" for preset, s in PRESETS.items())


def cached_step(config: TokenMergeConfig, step: int, steps: int | None = None) -> bool:
    """Whether a generation's ``step`` (0-based) of ``steps`` (where known) is a cached one: after the first
    ``full_steps``, all but every ``refresh_every``-th."""
    s = settings(config, steps)
    after = step - s.full_steps
    return after >= 0 and after % s.refresh_every != 0


def window_of(config: TokenMergeConfig, steps: int | None = None) -> int:
    """Tokens per window: one of them recomputed per cached step."""
    return max(1, round(1 / settings(config, steps).recompute))


def select(change: torch.Tensor, window: int, offset: int = 0, count: int | None = None) -> torch.Tensor:
    """Each window's most changed token, per sample: (B, N) scores -> (B, ceil((offset + N) / window)) positions, in
    order. ``offset``: the scores start that far into their first window (a rank's part of a whole grid, whose
    windows it keeps); ``count``: at least that many, topped up with the most changed of the others."""
    b, n = change.shape
    windows = math.ceil((offset + n) / window)
    padded = torch.nn.functional.pad(change, (offset, windows * window - n - offset), value=float("-inf"))
    best = padded.view(b, windows, window).argmax(-1) + torch.arange(windows, device=change.device) * window - offset
    if count is not None and count > windows:
        others = change.scatter(1, best, float("-inf")).topk(count - windows, dim=1).indices
        best = torch.cat([best, others], dim=1).sort(dim=1).values
    return best


class TokenCache(Method):
    name = "tokencache"
    summary = "recomputes only the tokens that changed since the last step (diffusion transformers)"
    primary = "recompute"
    options = (
        Option(
            "preset",
            "choice",
            "quality",
            "the settings of the options recompute, refresh_every, full_steps and forecast that are not given: quality "
            "(2.8x less work, the closest to vanilla at it) or fast (5.3x, above ToMe r=0.5)",
            choices=tuple(PRESETS),
        ),
        Option(
            "recompute",
            "real",
            None,
            "the share of each sample's image tokens a cached step recomputes (1: every token)",
            low=0,
            high=1,
            open="low",
            step=0.01,
            none=_preset_values("recompute"),
            none_word="preset",
        ),
        Option(
            "refresh_every",
            "int",
            None,
            "after the first full steps, a full step every this many steps",
            low=1,
            widget_max=100,
            none=_preset_values("refresh_every"),
            none_word="preset",
        ),
        Option(
            "full_steps",
            "int",
            None,
            "the first steps of a generation, computed fully",
            low=0,
            widget_max=100,
            none=_preset_values("full_steps"),
            none_word="preset",
            widget_none=-1,
        ),
        Option(
            "cache_dtype",
            "dtype",
            "int8",
            "how cached outputs, keys and values are kept (int8: a scale per token and 64 channels, about half of bf16's memory)",
            choices=CACHE_DTYPES,
            none="the model's own dtype, exact",
            none_word="model",
        ),
        Option(
            "forecast",
            "real",
            None,
            "how far a cached token's outputs move on along their change per step between its last two computations "
            "(0: held; 1: extrapolated, first order, as TaylorSeer); above 0 one more cache per span",
            low=0,
            high=1,
            step=0.05,
            none=_preset_values("forecast"),
            none_word="preset",
            widget_none=-1,
        ),
        Option(
            "memory",
            "choice",
            "default",
            "low keeps every cache as int4 and the block inputs as int8 (about a quarter of bf16's memory)",
            choices=("default", "low"),
        ),
    )
    routes = ("diffusers", "ldm", "webui", "comfyui-blocks")
    gathers = True  # its spans run on gathered tokens (the recomputed ones)
    every_span = True  # attention, cross-attention and MLP are cached alike (merge_* options do not apply)
    per_generation = True

    def is_identity(self, config: TokenMergeConfig) -> bool:
        return settings(config).recompute >= 1

    def validate(self, config: TokenMergeConfig) -> None:
        if config.memory == "low" and config.cache_dtype not in ("int8", "int4"):
            raise ValueError(
                f"memory='low' keeps the token cache as int4; cache_dtype={config.cache_dtype!r} asks otherwise: leave "
                "cache_dtype at its default with memory='low', or set memory='default'"
            )

    def new_generations(self) -> Generations:
        return Generations()

    def begin(self, config: TokenMergeConfig, generation: Generation) -> None:
        """A call of the generation begins: is it a full step? (The step count advances past the calls whose blocks
        ran: a step that a step cache skipped neither advances nor records anything.)"""
        generation.cache_dtype = kept_as(config)
        generation.forecast = settings(config).forecast
        if generation.ran:
            generation.steps += 1
            generation.ran = False
        generation.full = not cached_step(config, generation.steps, generation.schedule) or not generation.outputs

    def act(self, config: TokenMergeConfig, facts: BlockFacts) -> BlockAction:
        generation: Generation = facts.generation
        grid = facts.grid
        if facts.tokens is None:  # describe(): what a cached step leaves out
            return BlockAction(left_out=grid.numel - math.ceil(grid.numel / window_of(config)), around_block=facts.around_block is None)
        if generation is None or torch.compiler.is_compiling():  # (compiled code: said once by the hooks)
            return idle("no generation" if generation is None else "inside a compiled graph")
        generation.ran = True
        if generation.full and generation.final:  # its schedule's last step: nothing would read what it records
            return idle("the generation's last step, computed whole")
        around = facts.around_block is None  # its family measured one residual per block as good as its spans' outputs
        if grid.shape not in generation.selections:  # the call's first block on this grid: choose its tokens
            generation.selections[grid.shape] = self._choose(config, generation, grid, facts.tokens().detach(), facts.shard)
        whole = SelectSpan(generation, facts.block, None, grid.numel, gap=generation.gaps.get(grid.shape))
        selection = generation.selections[grid.shape]
        if selection is None:
            return BlockAction(plan=whole, around_block=around)
        spans = (AROUND_BLOCK,) if around else range(facts.spans)
        recorded = all((facts.block, s) in generation.outputs for s in spans) and all(
            (facts.block, s) in generation.keys for s in facts.cached_sites
        )
        if not recorded:  # not recorded on the last full step (gated, left whole there): compute it whole, record it
            return BlockAction(plan=whole, around_block=around)
        plan = SelectSpan(generation, facts.block, selection, grid.numel, generation.ages.get(grid.shape), generation.gaps.get(grid.shape))
        return BlockAction(plan=plan, left_out=grid.numel - selection.shape[1], around_block=around)

    @staticmethod
    def _choose(
        config: TokenMergeConfig, generation: Generation, grid: TokenGrid, x: torch.Tensor, shard: Shard | None
    ) -> torch.Tensor | None:
        """The image tokens this call recomputes on ``grid`` from its first block's input ``x`` (B, N, C), each
        window's most changed since it was last computed; ``None``: every token (a full step, or a grid the last full
        step did not see), the input recorded. Under context parallelism (``shard``: this rank's part of the whole
        grid) the windows are the whole grid's, each rank choosing among its own tokens as many as the rank meeting
        the most windows."""
        last = generation.inputs.get(grid.shape)
        age = generation.ages.get(grid.shape) if generation.forecast else None
        if age is not None and age.shape == x.shape[:2]:
            age += 1
        elif generation.forecast:
            age = generation.ages[grid.shape] = torch.ones(x.shape[:2], device=x.device)
        if age is not None:  # (this step's slopes divide by it; the tokens it computes are then 0 steps old)
            generation.gaps[grid.shape] = age.clone()
        if generation.full or last is None or last.shape != x.shape:
            generation.inputs[grid.shape] = store(x, _input_dtype(generation.cache_dtype))
            if age is not None:
                age.zero_()
            return None
        last.thaw()
        before = last.read(x.dtype)
        change = (x - before).float().norm(dim=-1) / before.float().norm(dim=-1).clamp_min(1e-6)
        window = window_of(config, generation.schedule)
        selection = select(change, window, *(shard.windows(window) if shard is not None else (0, None)))
        at = selection[..., None].expand(-1, -1, x.shape[-1])
        last.write(1, at, x.gather(1, at))
        if age is not None:
            age.scatter_(1, selection, 0.0)
        return selection

    def acting_steps(self, config: TokenMergeConfig, steps: int) -> list[int]:
        return [i for i in range(steps) if cached_step(config, i, steps)]

    def short_schedule(self, config: TokenMergeConfig, steps: int) -> str | None:
        if self.acting_steps(config, steps):
            return None
        s = settings(config, steps)
        said = (
            f"method='tokencache' computes the first full_steps={s.full_steps} step(s) of a generation fully, and one in "
            f"every refresh_every={s.refresh_every} after them; this schedule has {steps} step(s), so none is cached "
            "and the output is the unpatched model's"
        )
        if steps < 2:
            return f"{said} (a one-step generation has no later step to reuse a cache)"
        if s.refresh_every < 2:
            return f"{said}: refresh_every >= 2 lets it act"
        return f"{said}: full_steps={steps - 2} or less lets it act (tokenmerge.describe(pipe, steps=N, size=...) counts its steps)"

    def held(self, generations: Generations) -> str:
        used = [g for g in generations.slots if g.outputs]
        if not used:
            return "nothing held in this thread (kept per generation from its first call to its end, or to remove_patch)"
        per_block = [n for g in used for block, n in g.block_bytes().items() if block is not None]
        blocks = len({block for g in used for block in g.block_bytes() if block is not None})
        total = sum(g.nbytes for g in used)
        mib = 2**20
        outputs = sum(t.nbytes for g in used for t in g.outputs.values()) / mib  # span outputs or block residuals
        keys = sum(k.nbytes + v.nbytes for g in used for k, v, _ in g.keys.values()) / mib
        inputs = total / mib - outputs - keys
        device = next(iter(used[0].outputs.values())).device
        kept = used[0].cache_dtype or "the model's dtype"
        return (
            f"{total / mib:.1f} MiB held in this thread on {device} ({len(used)} guidance slot(s), batch {used[0].key[0]}): "
            f"span outputs (or block residuals) {outputs:.1f} MiB and keys and values {keys:.1f} MiB as {kept}, block inputs {inputs:.1f} MiB; "
            f"{sum(per_block) / max(1, blocks) / mib:.2f} MiB per block on average; freed when the generation ends or by remove_patch"
        )

    def describe(self, config: TokenMergeConfig, action: BlockAction | None, grid: TokenGrid | None, spans: tuple[str, ...]) -> str:
        k, s = window_of(config), settings(config)
        cached = (
            "the block's residual (the block run whole on the recomputed tokens)" if action and action.around_block else ", ".join(spans)
        )
        what = (
            f"cache {cached} per token (preset {config.preset!r}): full steps (the first {s.full_steps}, then every {s.refresh_every}th), "
            f"between them 1 token in {k} recomputed"
        )
        if grid is None or action is None:
            return what
        if action.reason:
            return f"unchanged ({action.reason})"
        return f"{what} ({grid.numel - action.left_out} of {grid.numel}, {grid})"
