"""What a method is: the options it reads, its per-block decision, what ``describe()`` prints of it, where it runs.

A method acts on one block of one call given the facts a front end gathers (:class:`BlockFacts`: the block's level,
its token grid, the call's noise level, the tokens to match on, the caches it may reuse plans from, context
parallelism's split). The checks every method shares (identity options, the level, the noise gate, a step cache's
deciding block, a rank's part of the grid) are made once, in :func:`tokenmerge.planning.decide`, which then asks the
method. Nothing here imports a model library or the option set (:mod:`tokenmerge.config` imports the methods).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ..algorithms import Shard, TokenGrid, TokenSpan
from ..options import Option

if TYPE_CHECKING:
    from ..config import TokenMergeConfig
    from ..steps import StepPosition

# Where a method can run: the diffusers / ldm / sgm hooks, ComfyUI's UNet attention patches, ComfyUI's DiT attention
# override (one attention call at a time: key/value methods only), the webui and Forge (through the ldm hooks and
# ComfyUI-style patches).
# comfyui-dit: ComfyUI's attention override (keys and values); comfyui-blocks: its DiTs' block replace patches (span plans around whole blocks)
ROUTES = ("diffusers", "ldm", "comfyui-unet", "comfyui-dit", "comfyui-blocks", "webui", "forge")


@dataclass(frozen=True)
class BlockAction:
    """One block's work in one call: run its spans (or the whole block, ``around_block``) on the tokens ``plan`` gathers
    (a :class:`~tokenmerge.algorithms.TokenSpan`: merged ones, or a selection), or downsample the keys and values of its
    ``kv_grid`` image tokens by ``kv_factors`` (one per grid axis; todo/auto), or nothing. ``kv_keep``: under
    sequence parallelism, the positions of this rank's image tokens whose keys and values are kept (the whole
    grid's selection). ``left_out``: the tokens its spans do not run on (known without a plan, for ``describe()``); ``reason``:
    why the block runs whole, where it does; ``around_block``: the plan gathers the block's input and scatters its
    output (the block runs on the gathered tokens alone, each other token given its input plus the plan's residual)
    instead of around each span."""

    plan: TokenSpan | None = None
    kv_grid: TokenGrid | None = None
    kv_factors: tuple[int, ...] = ()
    kv_keep: torch.Tensor | None = None
    left_out: int = 0
    reason: str = ""
    around_block: bool = False

    @property
    def kv_factor(self) -> int:
        """The spatial key/value factor (1 when keys and values are not downsampled)."""
        return self.kv_factors[-1] if self.kv_factors else 1

    @property
    def kv_label(self) -> str:
        """The factors as a user writes them: ``3`` (each spatial side) or ``2x3x3`` (frames x height x width)."""
        leading, spatial = self.kv_factors[:-2], self.kv_factors[-2:]
        if all([f == 1 for f in leading]) and len(set(spatial)) <= 1:
            return str(self.kv_factor)
        return "x".join(map(str, self.kv_factors))

    @property
    def idle(self) -> bool:
        return self.plan is None and self.kv_grid is None


IDLE = BlockAction()


def idle(reason: str) -> BlockAction:
    """Nothing to do, and why (``describe()`` says it)."""
    return BlockAction(reason=reason)


@dataclass
class BlockFacts:
    """What a front end knows of one block in one call.

    ``grid``: the block's token grid (under context parallelism the rank's part, ``whole`` the grid it is part of, and
    ``shard`` how); ``tokens``: a function giving the (B, N, C) image tokens a merge matches on (None where no call
    runs: ``describe()``); ``key``: the block's random-partition key; ``timestep``: the call's (the partition's
    randomness follows it); ``plans``: where plans may be reused (:class:`PlanStore`); ``decider``: a function naming
    the step cache that decides by this block's output, if any (blocks that decide a cache run whole under methods that gather tokens)."""

    level: int
    top_level: int
    grid: TokenGrid | None
    whole: TokenGrid | None = None
    shard: Shard | None = None
    uneven: bool = False  # the context-parallel split allows ranks of unequal lengths
    noise: float | None = None
    position: StepPosition | None = None  # the call's step in its schedule, where the few-step rule needs it
    tokens: Callable[[], torch.Tensor] | None = None
    key: int | torch.Tensor = 0
    timestep: torch.Tensor | None = None
    plans: PlanStore | None = None
    decider: Callable[[], str | None] | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    notes: list[tuple[str, str]] = field(default_factory=list)  # (topic, message) to say once per patch
    block: int = -1  # the block's index
    spans: int = 0  # how many spans the block has
    cached_sites: tuple[int, ...] = ()  # its attention sites whose keys and values a span that fills keys keeps
    # why the block cannot run whole on gathered tokens (BlockAction.around_block); None: it can
    around_block: str | None = "its family runs it span by span"
    generation: Any = None  # the call's generation state (methods with per_generation)


class ThreadGenerations:
    """Where a patch keeps a per-generation method's generations: one store per thread (the one its
    ``new_generations`` makes), made afresh when ``epoch`` (the options') changes. Every front end keeps its
    generations in one: the diffusers and ldm hooks, both ComfyUI routes, the webui. Not pickled (a copy starts
    afresh)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._local = threading.local()

    def of(self, method: Method, epoch: int = 0) -> Any:
        """This thread's store for ``method`` under options ``epoch``."""
        found = getattr(self._local, "store", None)
        if found is None or found[0] != epoch:
            found = self._local.store = (epoch, method.new_generations())
        return found[1]

    def end(self) -> None:
        """This thread's generations are over: what they hold is freed, the next call starts afresh."""
        found = getattr(self._local, "store", None)
        if found is not None:
            found[1].clear()

    @property
    def nbytes(self) -> int:
        """Bytes this thread's generations hold."""
        found = getattr(self._local, "store", None)
        return 0 if found is None else found[1].nbytes


@dataclass
class PlanStore:
    """Where one call keeps plans it may reuse: ``call`` (per call: one plan per level, ``share_plan``) and ``steps``
    (per thread across calls: ``reuse_steps``, keyed by a step count that ``step`` gives), ``recomputing`` while a
    checkpointed block is recomputed in backward (plans of that call only)."""

    call: dict[tuple, Any]
    block: int = -1  # the block's index (its own plan across steps)
    steps: Callable[[], Any] | None = None
    step: int = -1
    recomputing: bool = False
    shared_by_batch: bool = False  # the patch's fallback: one plan for the batch (hooks.tokens.SampleRows)


class Method:
    """One method: subclasses set the class attributes and implement :meth:`act`."""

    name: ClassVar[str]
    summary: ClassVar[str]  # what it does, in a few words (the method option's help, the ComfyUI node's description)
    options: ClassVar[tuple[Option, ...]] = ()  # the options it declares (tokenmerge.options)
    also_reads: ClassVar[tuple[str, ...]] = ()  # options declared elsewhere that it reads too
    primary: ClassVar[str | None] = None  # the option a command line's "method:value" sets (tome:0.5 -> ratio)
    reads: ClassVar[tuple[str, ...]]  # the options it reads: its own and also_reads (the others: "does not use")
    routes: ClassVar[tuple[str, ...]] = tuple(r for r in ROUTES if r != "comfyui-blocks")  # key/value methods: the override
    default_max_noise: ClassVar[float] = 1.0  # max_noise=None: reduce the steps at noise <= this (1 = every step)
    # max_noise=None on a few-step schedule (tokenmerge.steps): reduce this share of its last steps instead (None: the
    # noise rule holds there too)
    few_step_share: ClassVar[float | None] = None
    every_level: ClassVar[bool] = False  # with max_downsample=None, every level (its rule leaves small grids alone)
    reduces_keys: ClassVar[bool] = False  # acts on attention keys and values (a processor's own kernel escapes it)
    gathers: ClassVar[bool] = False  # its spans run on gathered tokens (a TokenSpan; a step cache's deciding block then runs whole)
    supports_ring: ClassVar[bool] = True  # under ring attention (ranks attend to keys they do not hold)
    every_span: ClassVar[bool] = False  # acts on every span of a block, whatever the merge_* options
    per_generation: ClassVar[bool] = False  # keeps state across the calls of a generation (begin() starts each call)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.reads = tuple(o.name for o in cls.options) + cls.also_reads

    def validate(self, config: TokenMergeConfig) -> None:
        """Raise where options that each pass their own check contradict one another."""

    def new_generations(self) -> Any:
        """A new store of one thread's generations (methods with ``per_generation``): ``begin_call(config, x,
        timestep, noise, marker, final)`` gives a call's generation, ``end(generation)`` and ``clear()`` free them,
        ``nbytes`` counts what they hold. The front ends keep one per thread and patch."""
        raise NotImplementedError(f"method {self.name!r} keeps no state across calls")

    def begin(self, config: TokenMergeConfig, generation: Any) -> None:
        """A call of a generation begins (methods with ``per_generation``)."""

    def short_schedule(self, config: TokenMergeConfig, steps: int) -> str | None:
        """What to say where a schedule of ``steps`` steps is too short for these options to act on any (None: it is
        not; methods with ``per_generation``)."""
        return None

    def acting_steps(self, config: TokenMergeConfig, steps: int) -> list[int] | None:
        """The steps (0-based) of a ``steps``-step generation it acts on, for ``describe(steps=N)`` (None: every
        step the gate lets through)."""
        return None

    def held(self, generations: Any) -> str:
        """What this thread's generations hold (methods with ``per_generation``), for ``describe()``."""
        return ""

    def is_identity(self, config: TokenMergeConfig) -> bool:
        """Whether these options leave every block unchanged."""
        return False

    def act(self, config: TokenMergeConfig, facts: BlockFacts) -> BlockAction:
        """The block's action, after the checks every method shares (:func:`tokenmerge.planning.decide`)."""
        raise NotImplementedError

    def on_shard(self, config: TokenMergeConfig, shard: Shard) -> str | None:
        """Why a rank's part of a grid cannot be reduced as ``config`` asks (None: it can)."""
        return None

    def void(self, config: TokenMergeConfig, grid: TokenGrid, action: BlockAction) -> tuple[str, str] | None:
        """(cause, message) where the options reach a block but cannot act on its grid (said once per patch)."""
        return None

    def describe(self, config: TokenMergeConfig, action: BlockAction | None, grid: TokenGrid | None, spans: tuple[str, ...]) -> str:
        """What a block does, for ``describe()``: at a grid (``action`` decided there) or in general."""
        raise NotImplementedError

    def warnings_at_patch(self, config: TokenMergeConfig) -> list[str]:
        """What ``apply_patch`` says about these options whatever the model (a ratio above the reachable one)."""
        return []

    def frame_option(self, config: TokenMergeConfig) -> tuple[str, str] | None:
        """(option, value in effect) of an option that acts on a video's frames, set away from its default."""
        return None

    def idle_notice(self, config: TokenMergeConfig, largest: TokenGrid) -> str | None:
        """What to say when the method left every block of a call whole by its own rule, whose largest token grid was
        ``largest`` (None: nothing)."""
        return None
