"""State of a patch: what is fixed (options, blocks) and what belongs to one forward call.

A patched model can be called from several threads at once (a server sharing one pipeline) and recomputed
in backward (gradient checkpointing), so nothing about one call may live on objects that other calls
share. The denoiser's pre-hook opens a :class:`CallState` (timestep, token grids, each block's decision)
on a stack that belongs to the calling thread; every inner hook reads the call on top of its thread's
stack; the denoiser's post-hook closes it (also when the forward raises).

Recomputation: a checkpointed block (or a whole checkpointed denoiser) runs again during backward, after
other calls may have run. When grad is enabled, the call's state is registered under the storage of the
block's (and the denoiser's) input tensor, and held alive by an identity autograd node on the block input,
so it lives exactly as long as the graph that may recompute it. In backward, the hooks find the recorded
call by that input and replay its decisions; without a record a recompute raises rather than guess.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from ..algorithms import TokenLayout
from ..config import TokenMergeConfig
from ..methods import BlockAction, ThreadGenerations
from ..notices import SayOnce
from ..steps import StepPosition, StepTrack
from . import dispatch


def in_backward() -> bool:
    """True while the autograd engine runs a backward pass in this thread (checkpoint recomputation)."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    return current is not None and current() != -1


def storage_key(x: torch.Tensor) -> tuple:
    """What identifies a tensor's data across ``detach()`` / ``view_as()`` (the forms checkpointing replays)."""
    return (x.untyped_storage().data_ptr(), x.storage_offset(), tuple(x.shape), x.stride(), x.dtype, str(x.device))


@dataclass
class BlockCall:
    """One block's decision in one call, and where its merged spans stand right now."""

    action: BlockAction
    layout: TokenLayout | None = None  # the call's token layout where this block runs (its streams derive from it)
    active: dict[int, Any] = field(default_factory=dict)  # span index -> (plan, stream layout) its input was merged with
    inputs: dict[int, Any] = field(default_factory=dict)  # span index -> its full input, where its attention may need it
    chunk_cursor: int = 0
    info: BlockInfo | None = None  # the block's fixed facts (its spans and sites), for the hooks inside it
    # around_block: its input stream as it came, its image tokens gathered, the stream's layout (until it returns)
    around: tuple[torch.Tensor, torch.Tensor, TokenLayout] | None = None

    def begin(self) -> None:
        """Start (or restart, when recomputed) the block's execution."""
        self.active.clear()
        self.inputs.clear()
        self.chunk_cursor = 0


@dataclass
class CallState:
    """One forward call of a patched denoiser."""

    config: TokenMergeConfig  # the options in force when the call began
    timestep: torch.Tensor | None
    step: int
    layouts: dict[int, TokenLayout | None] = field(default_factory=dict)  # container index -> its tokens' layout
    declined: set[int] = field(default_factory=set)  # containers whose reader declined this call (and said why)
    blocks: dict[int, BlockCall] = field(default_factory=dict)  # by block index (eager calls: for recomputation)
    # The innermost open container's layout and the running block: what the hooks inside read, so that no hook looks
    # itself up by its block's index (an int a compiled graph would be specialised on: one graph per block).
    containers: list[TokenLayout | None] = field(default_factory=list)
    running: BlockCall | None = None
    level_plans: dict[tuple, Any] = field(default_factory=dict)  # share_plan: one matching per level and call
    recomputing: bool = False
    split: Any = None  # hooks.parallel.ContextSplit: the context-parallel split this call runs under, if any
    noise: float | None = None  # the call's noise level where max_noise needs it (planning.noise_level)
    position: StepPosition | None = None  # the call's step in its schedule, where the few-step rule needs it
    cache_lists: Any = None  # hooks.step_caches.cache_dit_lists of the denoiser, read as the call began (methods that gather tokens)
    generation: Any = None  # a per-generation method's state of this call (one of its generations' slots)


class _Anchor(torch.autograd.Function):
    """Identity on a block's input that keeps the call's state alive as long as the graph through it."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, call: CallState) -> torch.Tensor:
        ctx.call = call
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


@dataclass
class StepCache:
    """``reuse_steps`` / ``share_plan``: matchings kept across calls, per thread (a generation runs in one
    thread, so concurrent generations never see each other's plans). Reset when the options change."""

    epoch: int
    step: int = -1
    last_timestep: list[float] | None = None
    plans: dict[tuple, tuple] = field(default_factory=dict)  # key -> (shape, step, plan)


@dataclass
class BlockInfo:
    """Fixed facts of one patched block."""

    index: int
    level: int
    key: torch.Tensor  # of the random partition: (1,) int64, a tensor so that compiled blocks share one graph
    container: int
    input: Any  # families.base.Argument: the block's input tokens (the matching is computed on their image segment)
    layout: Any  # families.BlockLayout
    per_token: tuple[Any, ...] = ()  # families.base.Argument: its arguments that may have a row per token (BlockOutput)


class BlockWarnings:
    """What a block's hook says about one cause: once per patch (and options), whichever block meets it first, never
    once per block (a real-depth model has dozens)."""

    def __init__(self, patch: PatchState, block: int) -> None:
        self.patch = patch
        self.block = block

    def warn_once(self, cause: str, message: str) -> None:
        self.patch.notice(f"block: {cause}", f"transformer block {self.block}: {message} (said once, for every block it concerns)")


class Untraced:
    """A hook torch.compile does not trace (a graph break that runs it eagerly): a module-level object, so that a
    patched model still deep-copies (each copy's hooks its own) and pickles."""

    def __init__(self, hook: Any) -> None:
        self.hook = hook

    @torch.compiler.disable
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.hook(*args, **kwargs)


class PatchState:
    """Options and fixed facts of one patched denoiser; per-call facts live on per-thread call stacks."""

    RECENT_CALLS = 8  # grad-enabled calls kept for recomputation even where no block input requires grad

    def __init__(self, config: TokenMergeConfig, layout: Any) -> None:
        self.config = config
        self.layout = layout  # families.DenoiserLayout
        self.blocks: list[BlockInfo] = []
        self.handles: list[RemovableHandle] = []
        self.hooks: dict[int, Any] = {}  # handle id -> the hook object (registered as it is, or not traced: bind_hooks)
        self.wrapped: list[tuple[torch.nn.Module, str]] = []  # (module, attribute) of removable wrappers
        self.routes_dispatch = False  # holds the diffusers dispatch route (hooks.dispatch) while installed
        self.said = SayOnce(f"{type(layout.root).__name__}: ")
        # ToMe plans shared by the batch: only where this model's attention code took a per-sample table the way
        # hooks.tokens.SampleRows cannot give it (said once); every image of a batch then depends on the others.
        self.shared_plans = False
        self.epoch = 0
        self.__setstate__({})
        self.pipeline: Any = None  # a weak reference to the diffusers pipeline patched with it (its scheduler's steps)
        self.known_steps: int | None = None  # the steps of the generation a front end began (the webui's sampling)

    # -- options ---------------------------------------------------------------------------------------

    def notice(self, topic: str, message: str) -> None:
        """What every block would repeat (a context-parallel split it cannot reduce, a step cache in its merged
        spans) is said once per topic and options."""
        self.said.say(topic, message)

    def set_config(self, config: TokenMergeConfig) -> None:
        """New options for the calls that begin from now on; cached matchings are dropped."""
        stateful = self.config.method_of.per_generation
        self.config = config
        self.epoch += 1
        self.said.renew()
        if config.method_of.per_generation != stateful:
            self.bind_hooks()

    def bind_hooks(self) -> None:
        """Register each hook as itself, or, for a method that keeps state across a generation's calls (the token
        cache: its caches change at every step, and a graph that read them would be specialised on them), as a
        function ``torch.compile`` does not trace: under compilation each such hook is a graph break and runs
        eagerly, and the compiled pieces between them see tensors only (a full step's tokens, or a cached step's
        fewer). At install and whenever the options change the method's kind."""
        stateful = self.config.method_of.per_generation
        for handle in self.handles:
            hooks = handle.hooks_dict_ref()
            hook = self.hooks.get(handle.id)
            if hooks is not None and hook is not None and handle.id in hooks:
                hooks[handle.id] = Untraced(hook) if stateful else hook

    # -- the calling thread's calls ----------------------------------------------------------------------
    def _stack(self) -> list[CallState]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def current(self) -> CallState | None:
        stack = self._stack()
        return stack[-1] if stack else None

    def push(self, call: CallState) -> None:
        self._stack().append(call)

    def pop(self, call: CallState) -> None:
        stack = self._stack()
        if stack and stack[-1] is call:
            stack.pop()

    def mark_block_entry(self, index: int) -> None:
        """A recomputed block pushed its recorded call: the block's post-hook pops it."""
        entries = getattr(self._local, "entries", None)
        if entries is None:
            entries = self._local.entries = []
        entries.append((index, self.current()))

    def leave_block_entry(self, index: int) -> None:
        entries = getattr(self._local, "entries", None)
        if entries and entries[-1][0] == index:
            _, call = entries.pop()
            self.pop(call)

    def open_mode(self, module: torch.nn.Module, mode: Any) -> None:
        """Remember an SDPA mode a pre-hook entered for ``module``'s call in this thread."""
        modes = getattr(self._local, "modes", None)
        if modes is None:
            modes = self._local.modes = []
        modes.append((module, mode))

    def open_mode_of(self, module: torch.nn.Module, kind: type) -> Any:
        """The mode of class ``kind`` open for ``module``'s call in this thread, if it is the innermost one."""
        modes = getattr(self._local, "modes", None)
        return modes[-1][1] if modes and modes[-1][0] is module and isinstance(modes[-1][1], kind) else None

    def close_mode(self, module: torch.nn.Module, kind: type) -> Any:
        """Forget the mode of class ``kind`` open for ``module``'s call (the innermost one) and return it."""
        mode = self.open_mode_of(module, kind)
        if mode is not None:
            self._local.modes.pop()
        return mode

    def open_modes(self) -> list[Any]:
        """The SDPA modes still open in this thread (an attention raised before its forward hook), innermost first;
        they are forgotten here."""
        modes = getattr(self._local, "modes", None)
        if not modes:
            return []
        left = [mode for _, mode in reversed(modes)]
        modes.clear()
        return left

    def step_cache(self) -> StepCache:
        cache = getattr(self._local, "cache", None)
        if cache is None or cache.epoch != self.epoch:
            cache = self._local.cache = StepCache(self.epoch)
        return cache

    def step_track(self) -> StepTrack:
        """This thread's noise levels of the current generation's steps (:mod:`tokenmerge.steps`)."""
        found = getattr(self._local, "steps", None)
        if found is None or found[0] != self.epoch:
            found = self._local.steps = (self.epoch, StepTrack())
        return found[1]

    def scheduled_levels(self) -> list[float] | None:
        """The noise levels of the steps of the patched pipeline's schedule, as its ``__call__`` set its scheduler
        (None where no pipeline was patched or its scheduler has no timesteps)."""
        found = self.schedule()
        return None if found is None else found[1]

    def schedule(self) -> tuple[torch.Tensor, list[float]] | None:
        """The patched pipeline's schedule: its scheduler's timesteps (a new tensor for each generation: every call of
        the pipeline sets them) and their noise levels, read once per schedule (None where no pipeline was patched or
        its scheduler has no timesteps)."""
        pipe = self.pipeline() if self.pipeline is not None else None
        scheduler = getattr(pipe, "scheduler", None)
        timesteps = getattr(scheduler, "timesteps", None)
        if not isinstance(timesteps, torch.Tensor) or timesteps.numel() == 0:
            return None
        found = getattr(self._local, "levels", None)
        if found is None or found[0] is not timesteps:  # read once per set_timesteps
            scale = getattr(getattr(scheduler, "config", None), "num_train_timesteps", None) or 1000
            found = self._local.levels = (timesteps, (timesteps.detach().float().cpu() / scale).tolist())
        return found

    def generations(self) -> Any:
        """This thread's generations of a per-generation method (the store its ``new_generations`` makes), started
        afresh when the options change; dropped with the patch."""
        return self._generations.of(self.config.method_of, self.epoch)

    def end_generations(self) -> None:
        """This thread's generations are over (a front end's generation ended, or begins): what they hold is freed."""
        self._generations.end()

    def cache_bytes(self) -> int:
        """Bytes this thread's generations hold (0 for other methods)."""
        return self._generations.nbytes

    # -- recomputation in backward ----------------------------------------------------------------------
    def record(self, x: torch.Tensor, call: CallState) -> None:
        key = storage_key(x)
        with self._lock:
            if len(self._records) > 4096:  # drop records whose graphs are gone
                self._records = {k: r for k, r in self._records.items() if r() is not None}
            self._records[key] = weakref.ref(call)
            if not self._recent or self._recent[-1] is not call:
                self._recent.append(call)

    def recorded(self, x: torch.Tensor) -> CallState | None:
        with self._lock:
            ref = self._records.get(storage_key(x))
        return None if ref is None else ref()

    def anchor(self, x: torch.Tensor, call: CallState) -> torch.Tensor:
        """``x`` as an identity node of the graph that keeps ``call`` alive; ``call`` is found again by ``x``."""
        self.record(x, call)
        return _Anchor.apply(x, call)

    def __getstate__(self) -> dict[str, Any]:
        # A copy is not tied to the pipeline of the original (a weak reference, not picklable): it reads its calls.
        return {k: v for k, v in self.__dict__.items() if k not in ("_records", "_recent", "_lock", "_local", "_generations", "pipeline")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("pipeline", None)
        if state.get("routes_dispatch"):  # a copy (deepcopy, pickle) of an installed patch holds the route too
            dispatch.acquire()
        self._records: dict[tuple, weakref.ref] = {}
        self._recent: deque[CallState] = deque(maxlen=self.RECENT_CALLS)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._generations = ThreadGenerations()
