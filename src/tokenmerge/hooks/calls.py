"""Hooks that open and close a call, capture each container's token grid, and decide each block's action."""

from __future__ import annotations

import weakref
from typing import Any

import torch

from ..algorithms import TokenLayout, shard_layout
from ..config import TokenMergeConfig
from ..families import get as get_family
from ..families.base import Declined
from ..methods import IDLE, BlockFacts, PlanStore
from ..planning import decide, gated, noise_level
from ..steps import StepPosition, counts_steps, few_step_notice, gate_notice, locate, position_in
from . import dispatch
from .parallel import ContextSplit, context_split
from .sites import keyword_route
from .state import BlockCall, BlockInfo, BlockWarnings, CallState, PatchState, in_backward
from .step_caches import cache_dit_lists, deciding_cache, extrapolating_cache

_INPUT_NAMES = ("hidden_states", "x", "sample")


def first_tensor(args: tuple, kwargs: dict[str, Any], names: tuple[str, ...] = _INPUT_NAMES) -> Any:
    """The module's main input: the first positional argument, or the first of ``names`` passed by keyword."""
    if args:
        return args[0]
    return next((kwargs[name] for name in names if name in kwargs), None)


def replace_first(args: tuple, kwargs: dict[str, Any], value: torch.Tensor, names: tuple[str, ...] = _INPUT_NAMES):
    """(args, kwargs) with the main input replaced by ``value``."""
    if args:
        return (value, *args[1:]), kwargs
    key = next(name for name in names if name in kwargs)
    return args, {**kwargs, key: value}


def image_tokens(x: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """The target image's tokens of a sequence ``x`` laid out as ``layout`` (``x`` itself when it holds only them)."""
    start, n = layout.image_start, layout.grid.numel
    return x if start == 0 and n == x.shape[1] else x[:, start : start + n]


# BeginCall hooks by id, for _traced (a function dynamo runs at trace time takes constants only).
_BEGIN_CALLS: weakref.WeakValueDictionary[int, BeginCall] = weakref.WeakValueDictionary()


@torch._dynamo.assume_constant_result
def _traced(key: int) -> bool:
    """Run by dynamo once, when it traces a call of a patched denoiser inside a compiled graph (never in eager): says
    that the noise gate cannot act there."""
    hook = _BEGIN_CALLS.get(key)
    if hook is not None:
        hook.notice_compiled()
    return True


class BeginCall:
    """Forward pre-hook on the denoiser: open this thread's call (or, in backward, the recorded one)."""

    def __init__(self, patch: PatchState) -> None:
        self.patch = patch
        self.timestep = patch.layout.timestep_reader()
        self.scale = get_family(patch.layout.family).timesteps
        _BEGIN_CALLS[id(self)] = self

    def __setstate__(self, state: dict[str, Any]) -> None:  # a copy (deepcopy, pickle) of a patched model
        self.__dict__.update(state)
        _BEGIN_CALLS[id(self)] = self

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        patch = self.patch
        x = first_tensor(args, kwargs)
        if not torch.compiler.is_compiling() and in_backward():
            # A checkpointed denoiser recomputed in backward: replay the decisions of its forward call.
            recorded = patch.recorded(x) if isinstance(x, torch.Tensor) else None
            t = self._timestep(args, kwargs)
            call = recorded or CallState(patch.config, t, -1, noise=self._noise(t, patch.config))
            call.recomputing = True
            patch.push(call)
            return
        t = self._timestep(args, kwargs)
        config = patch.config
        # The call's one host read of its timestep (a device sync), where something needs its value: a new denoising
        # step for reuse_steps, the noise gate, a generation's slot.
        values = t.flatten().tolist() if t is not None and self._reads(config) and not torch.compiler.is_compiling() else None
        step = -1
        if config.reuse_steps > 1:
            # A new denoising step is a new timestep value.
            cache = patch.step_cache()
            if values is None or values != cache.last_timestep:
                cache.step += 1
                cache.last_timestep = values
            step = cache.step
        noise = self._noise(t, values, config)
        position = self._position(noise, config)
        self._notice_gate(config, noise, position)
        call = CallState(config, t, step, split=context_split(patch.layout.root), noise=noise, position=position)
        if config.method_of.per_generation and not config.is_identity:  # (its hooks run eagerly: PatchState.bind_hooks)
            call.generation = self._generation(config, x, values)
        if patch.routes_dispatch and not torch.compiler.is_compiling():
            dispatch.ensure_wrapped()  # once per call: backends registered (cache-dit) after the patch get the route too
        patch.push(call)
        if config.method_of.gathers and not config.is_identity and not torch.compiler.is_compiling():
            call.cache_lists = cache_dit_lists(patch.layout.root)  # (before cache-dit's forward swaps them)
            self._notice_extrapolation()
        if torch.is_grad_enabled() and isinstance(x, torch.Tensor) and not torch.compiler.is_compiling():
            patch.record(x, call)

    @staticmethod
    def _reads(config: TokenMergeConfig) -> bool:
        """Whether a call under ``config`` needs its timestep's value."""
        if config.is_identity:
            return False
        return config.reuse_steps > 1 or config.noise_limit < 1 or config.method_of.per_generation

    def _generation(self, config: TokenMergeConfig, x: Any, values: list[float] | None) -> Any:
        """The generation this call belongs to (this thread's; one per classifier-free guidance slot). Under a patched
        pipeline its schedule scopes it: each of the pipeline's calls sets a new schedule (a new generation, whatever
        ended the last one) and the schedule's last step frees it; elsewhere it starts afresh when the noise level does
        not fall or the batch, dtype or device changes."""
        noise = None if values is None else noise_level(values, self.scale)
        schedule = self.patch.schedule()
        position = position_in(schedule[1], noise) if schedule is not None and noise is not None else None
        if position is None:
            return self.patch.generations().begin_call(config, x, values, noise, steps=self.patch.known_steps)
        message = config.method_of.short_schedule(config, position.total)  # a schedule too short to act on: said once
        if message is not None:
            self.patch.notice("short schedule", message)
        final = position.index == position.total - 1
        return self.patch.generations().begin_call(config, x, values, noise, schedule[0], final, position.total)

    def _notice_extrapolation(self) -> None:
        """A step cache forecasting its residuals under tome is said once: it runs, but loses more than either alone."""
        calibrator = extrapolating_cache(self.patch.layout.root)
        if calibrator is not None:
            self.patch.notice(
                "extrapolating cache",
                f"{calibrator} forecasts the cached blocks' residual from its change between computed steps; under "
                "tome that change holds ToMe's error, which differs from step to step, and the forecast magnifies it "
                "(Flux-style reference, r=0.3: 2.3 dB below ToMe r=0.5 alone; +0.2 dB above it without the calibrator). "
                "Enable the cache with calibrator_config=None, or use method='auto'",
            )

    def _noise(self, t: torch.Tensor | None, values: list[float] | None, config: TokenMergeConfig) -> float | None:
        """The call's noise level where ``max_noise`` needs it (from the call's one host read; not inside a compiled
        graph)."""
        if config.noise_limit >= 1 or config.is_identity:
            return None
        if torch.compiler.is_compiling():
            _traced(id(self))  # runs once, when the graph is traced: says that the gate cannot act
            return None
        if t is None:
            self.patch.notice(
                "noise", f"its call has no timestep to read, so max_noise={config.noise_limit:g} cannot act: every step is reduced"
            )
            return None
        return noise_level(values, self.scale)

    def _notice_gate(self, config: TokenMergeConfig, noise: float | None, position: StepPosition | None) -> None:
        """A call the noise gate leaves whole is said once per patch (auto's default leaves most steps of a flow
        pipeline whole; a few-step schedule is said by :meth:`_position`)."""
        if counts_steps(config, position):
            return  # said by _position
        if gated(config, noise, position):
            every_step = "tokenmerge.describe(pipe, steps=N, size=...) counts the steps reduced; max_noise=1 reduces every step"
            self.patch.notice("noise gate", gate_notice(config, noise, every_step))

    def _position(self, noise: float | None, config: TokenMergeConfig) -> StepPosition | None:
        """The call's step in its schedule where the default gate's few-step rule needs it: the patched pipeline's
        scheduler's, else estimated from this thread's calls (:mod:`tokenmerge.steps`). A few-step schedule is said
        once per patch."""
        if noise is None or config.few_step_share is None:
            return None
        patch = self.patch
        position = locate(patch.step_track(), patch.scheduled_levels(), noise)
        if position is not None and position.few:
            patch.notice("few steps", few_step_notice(config, position, "the pipeline's scheduler" if position.known else "its calls"))
        return position

    def notice_compiled(self) -> None:
        """Under torch.compile of the whole denoiser the timestep is not read: every step is reduced (said once)."""
        config = self.patch.config
        self.patch.notice(
            "compiled noise gate",
            f"the whole model is compiled, where the call's timestep cannot be read: max_noise={config.noise_limit:g} cannot "
            f"act and every step is reduced (for method={config.method!r} the speed-first setting). Compile its blocks "
            "instead (diffusers' model.compile_repeated_blocks()) to keep the noise gate",
        )

    def _timestep(self, args: tuple, kwargs: dict[str, Any]) -> torch.Tensor | None:
        t = self.timestep(args, kwargs) if self.timestep is not None else None
        if t is not None and not isinstance(t, torch.Tensor):
            t = torch.tensor(t)
        return t


class EndCall:
    """Forward hook (always called, also when the forward raises) on the denoiser: close this thread's call."""

    def __init__(self, patch: PatchState) -> None:
        self.patch = patch

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        for mode in self.patch.open_modes():  # an attention of this call raised: leave its SDPA mode
            dispatch.exit_mode(mode)
        call = self.patch.current()
        if call is not None:
            if not call.recomputing and not torch.compiler.is_compiling():
                self._notice_idle(module, call)
            if call.generation is not None and call.generation.final:  # its schedule's last step: nothing reads it again
                self.patch.generations().end(call.generation)
            call.recomputing = False
            self.patch.pop(call)

    def _notice_idle(self, module: torch.nn.Module, call: CallState) -> None:
        """A method leaving every block of a call alone by its own rule (auto on small grids, by design) is said once
        per options."""
        grids = [layout.grid if layout.shard is None else layout.shard.whole for layout in call.layouts.values() if layout is not None]
        if not grids or not call.blocks or not all(b.action.idle for b in call.blocks.values()):  # (eager calls: see PlanBlock)
            return
        if not self.patch.said.pending("idle"):
            return
        message = call.config.method_of.idle_notice(call.config, max(grids, key=lambda g: g.numel))
        if message is not None:
            self.patch.notice("idle", message)


class CaptureLayout:
    """Forward pre-hook on a container: its call gives the token layout (grid, text, references) of its blocks."""

    def __init__(self, patch: PatchState, index: int) -> None:
        self.patch = patch
        self.index = index

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        call = self.patch.current()
        if call is None:
            return
        if call.recomputing and self.index in call.layouts:
            call.containers.append(call.layouts[self.index])
            return
        found = self.patch.layout.containers[self.index].layout(args, kwargs)
        if isinstance(found, Declined):  # the reader said why already: no warning per block
            call.declined.add(self.index)
            found = None
        if found is not None and call.split is not None:
            found = self._shard(found, call.split, call)
        call.layouts[self.index] = found
        call.containers.append(found)

    def _shard(self, layout: TokenLayout, split: ContextSplit, call: CallState) -> TokenLayout | None:
        """The rank's part of the call's layout under context parallelism (None, said once, where it has none)."""
        if split.ring and not call.config.method_of.supports_ring:
            self.patch.notice(
                "parallel",
                f"method={call.config.method!r} under ring attention is not supported (a ring rank attends to keys it does "
                "not hold, whose merge sizes it cannot know); its blocks run unchanged. Use method='todo' or 'auto', or Ulysses",
            )
            return None
        found = shard_layout(layout, split.rank, split.world, split.text_split, split.uneven)
        if isinstance(found, str):
            self.patch.notice("parallel", f"under context parallelism over {split.world} ranks, {found}: its blocks run unchanged")
            return None
        return found


class LeaveContainer:
    """Forward hook (always called) on a container: its layout stops being the one its blocks read."""

    def __init__(self, patch: PatchState) -> None:
        self.patch = patch

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        call = self.patch.current()
        if call is not None and call.containers:
            call.containers.pop()


class PlanBlock:
    """Forward pre-hook on a transformer block: decide its action for this call from its input tokens.

    In backward (a checkpointed block recomputed) the decision of the forward call is replayed instead;
    where grad is enabled, the block input is anchored so that the call outlives its forward.
    """

    def __init__(self, patch: PatchState, info: BlockInfo) -> None:
        self.patch = patch
        self.info = info  # read through, never by index: see CallState.running
        self.warnings = BlockWarnings(patch, info.index)

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]):
        patch, info = self.patch, self.info
        call = patch.current()
        x = info.input(args, kwargs)
        if not torch.compiler.is_compiling() and in_backward():
            if call is not None and call.recomputing and info.index in call.blocks:
                call.running = call.blocks[info.index]
                call.running.begin()
                return None
            if call is None or not call.recomputing:
                recorded = patch.recorded(x) if isinstance(x, torch.Tensor) else None
                if recorded is None:
                    raise_lost_call(patch, info.index)
                patch.push(recorded)
                patch.mark_block_entry(info.index)
                recorded.running = recorded.blocks.setdefault(info.index, BlockCall(IDLE, info=info))
                recorded.running.begin()
                return None
        if call is None:  # the block runs outside a call of its denoiser (called directly): leave it alone
            return None
        layout = call.containers[-1] if call.containers else None
        block = call.running = BlockCall(self._decide(x, call, info, layout, module, args, kwargs), layout, info=info)
        if not torch.compiler.is_compiling():  # (a compiled graph holds no recomputation to replay)
            call.blocks[info.index] = block
        if call.recomputing or not isinstance(x, torch.Tensor) or not torch.is_grad_enabled() or torch.compiler.is_compiling():
            return None
        # A checkpointed block may be recomputed in backward: find this call again by the block's input.
        if x.requires_grad and not block.action.idle:
            return self.replace_input(args, kwargs, info, patch.anchor(x, call))
        patch.record(x, call)
        return None

    @staticmethod
    def replace_input(args: tuple, kwargs: dict[str, Any], info: Any, x: torch.Tensor):
        """(args, kwargs) with the block's input (``info.input``) replaced by ``x``."""
        if info.input.name in kwargs:
            return args, {**kwargs, info.input.name: x}
        position = info.input.position
        return (*args[:position], x, *args[position + 1 :]), kwargs

    def _decide(
        self, x: Any, call: CallState, info: Any, layout: TokenLayout | None, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]
    ):
        config = call.config
        if not isinstance(x, torch.Tensor) or x.ndim != 3 or layout is None:
            quiet = layout is None and info.container in call.declined
            if not quiet and not config.is_identity and config.merges_level(info.level, self.patch.layout.top_level):
                self.warnings.warn_once(
                    "unreadable", "could not read its (batch, tokens, channels) input or its token layout; it runs unchanged"
                )
            return IDLE
        stream = layout.stream(info.layout.input_stream)
        if call.split is not None and x.shape[1] != stream.total:
            # A block whose inputs the context-parallel plan splits (inside its forward) is handed the whole sequence.
            x = call.split.chunk(x)
        if x.shape[1] != stream.total:
            self.warnings.warn_once(
                "token count", f"got {x.shape[1]} tokens where its call's layout ({stream}) has {stream.total}; it runs unchanged"
            )
            return IDLE
        shard = layout.shard
        plans = PlanStore(
            call.level_plans,
            block=info.index,
            steps=self.patch.step_cache,
            step=call.step,
            recomputing=call.recomputing,
            shared_by_batch=self.patch.shared_plans,
        )
        facts = BlockFacts(
            level=info.level,
            top_level=self.patch.layout.top_level,
            grid=layout.grid,
            whole=None if shard is None else shard.whole,
            shard=shard,
            uneven=call.split is not None and call.split.uneven,
            noise=call.noise,
            position=call.position,
            tokens=lambda: image_tokens(x, stream),
            key=info.key,
            timestep=call.timestep,
            plans=plans,
            decider=lambda: self._decider(call, module, info),
            device=x.device,
            block=info.index,
            spans=len(info.layout.spans),
            cached_sites=tuple(k for k, site in enumerate(info.layout.kv_sites) if not keyword_route(site)),
            generation=call.generation,
            around_block=_around_block(info, x, args, kwargs),
        )
        action = decide(config, facts)
        for topic, message in facts.notes:
            if topic.startswith("block: "):
                self.warnings.warn_once(topic.removeprefix("block: "), message)
            else:
                self.patch.notice(topic, message)
        return action

    def _decider(self, call: CallState, module: torch.nn.Module, info: Any) -> str | None:
        """Which step cache decides by this block's output, if any (read from the model's hooks and cache-dit)."""
        lists = None if torch.compiler.is_compiling() else call.cache_lists
        return deciding_cache(self.patch.layout.root, module, info.index, lists)


def _around_block(info: BlockInfo, x: torch.Tensor, args: tuple, kwargs: dict[str, Any]) -> str | None:
    """Why the block cannot run whole on a gathered part of its image tokens (None: it can; see
    :class:`tokenmerge.families.base.BlockOutput`)."""
    if info.layout.output is None:
        return "its family runs it span by span"
    if any(keyword_route(site) for site in info.layout.kv_sites):
        return "its self-attention projects every token's keys from its input"
    if torch.is_grad_enabled() and x.requires_grad:
        return "its input requires grad (a checkpointed block replays its spans)"
    for argument in info.per_token:
        t = argument(args, kwargs)
        if isinstance(t, torch.Tensor) and t.ndim >= 3 and t.shape[1] in (x.shape[1], info.input(args, kwargs).shape[1]):
            return f"its {argument.name} has a row per token"
    return None


class EndBlock:
    """Forward hook (always called) on a block: it stops running; close the recorded call a recompute of it replayed."""

    def __init__(self, patch: PatchState, index: int) -> None:
        self.patch = patch
        self.index = index

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        call = self.patch.current()
        if call is not None:
            call.running = None
        if not torch.compiler.is_compiling():  # (a recompute in backward never runs in a compiled graph)
            self.patch.leave_block_entry(self.index)


class RecomputeEntry:
    """Stands in for an ldm/sgm block's ``_forward`` (an instance attribute, removed with the patch).

    These blocks checkpoint ``self._forward`` themselves, and their backward re-runs it without going
    through the block's hooks; this replays the forward call's decisions there. In forward it only calls
    the class's ``_forward``."""

    def __init__(self, patch: PatchState, index: int, block: torch.nn.Module, method: str) -> None:
        self.patch = patch
        self.index = index
        self.block = block
        self.method = method

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        run = getattr(type(self.block), self.method).__get__(self.block)
        if not in_backward():
            return run(*args, **kwargs)
        patch = self.patch
        x = patch.blocks[self.index].input(args, kwargs)
        recorded = patch.recorded(x) if isinstance(x, torch.Tensor) else None
        if recorded is None:
            raise_lost_call(patch, self.index)
        recorded.running = recorded.blocks.setdefault(self.index, BlockCall(IDLE, info=patch.blocks[self.index]))
        recorded.running.begin()
        patch.push(recorded)
        try:
            return run(*args, **kwargs)
        finally:
            patch.pop(recorded)


def raise_lost_call(patch: PatchState, index: int) -> None:
    raise RuntimeError(
        f"tokenmerge: transformer block {index} is recomputed in backward (gradient checkpointing), but the forward call "
        "it belongs to was not recorded or is gone: its forward ran without grad enabled, or more than "
        f"{patch.RECENT_CALLS} forward calls ago with no input requiring grad. Recomputing it with another call's "
        "plan would give wrong gradients. Run the forward with grad enabled, or remove the patch for this training run"
    )
