"""Run a denoiser under diffusers' context parallelism on this machine: ``world`` processes, ``gloo``, CPU.

diffusers splits a model's token sequence across ranks at the places its ``_cp_plan`` names and exchanges heads
(Ulysses all-to-all) or keys/values (ring) inside each attention. On CPU this needs one shim: diffusers picks a
rank's device as ``rank % torch.accelerator.device_count()``, so a CPU worker reports one device. Ring attention
needs a backend that returns the log-sum-exp, which no CPU backend of diffusers does; Ulysses runs.

:func:`run_ranks` spawns the ranks and returns rank 0's result; :func:`compare_family` is the check the tests and
``tokenmerge bench --cp`` run: per method, the patched model under context parallelism against the same model
patched in one process (and vanilla), with each rank's time and the bytes its attention exchanged.
"""

from __future__ import annotations

import functools
import os
import socket
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, threads: int, fn: Callable[..., Any], args: tuple, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(threads)
    torch.accelerator.device_count = lambda: 1  # diffusers: device = rank % device_count
    _ring_on_cpu()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()


def _ring_on_cpu() -> None:
    """diffusers' native attention under ring attention, on CPU: its forward op with the log-sum-exp a ring step
    merges by (torch's CPU flash attention; (B, S, H) as the flash op's), the plain op otherwise."""
    from diffusers.models import attention_dispatch as ad

    plain = ad._native_attention_forward_op

    def forward_op(
        ctx: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: Any = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
        return_lse: bool = False,
        **kwargs: Any,
    ) -> Any:
        if not return_lse:
            return plain(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, **kwargs)
        q, k, v = (x.transpose(1, 2) for x in (query, key, value))
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
        )
        return out.transpose(1, 2), lse.transpose(1, 2)

    ad._native_attention_forward_op = forward_op


def run_ranks(fn: Callable[..., Any], *args: Any, world: int = 2, threads: int = 1, timeout: float = 600) -> Any:
    """``fn(rank, world, *args)`` in ``world`` spawned processes joined by ``gloo``; rank 0's return value.

    ``fn`` must be importable (a module-level function) and its result picklable. A rank killed by a signal is run
    again once, said with a warning: a rank under diffusers' ``ulysses_anything`` over gloo aborted once in our CI
    runs (SIGABRT, "terminate called without an active exception", in C++ below Python) and passed on every rerun;
    a rank that raises, or dies twice, fails the run."""
    import torch.multiprocessing as mp

    try:
        return _run_ranks_once(fn, args, world, threads, timeout)
    except mp.ProcessExitedException as error:
        if error.signal_name is None:
            raise
        warnings.warn(f"context-parallel rank {error.error_index} died by {error.signal_name}; running the ranks again", stacklevel=2)
        return _run_ranks_once(fn, args, world, threads, timeout)


def _run_ranks_once(fn: Callable[..., Any], args: tuple, world: int, threads: int, timeout: float) -> Any:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "rank0.pt")
        context = mp.start_processes(
            _worker, args=(world, free_port(), threads, fn, args, out), nprocs=world, join=False, start_method="spawn"
        )
        deadline = time.monotonic() + timeout
        while not context.join(timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                raise TimeoutError(f"context-parallel ranks did not finish in {timeout:.0f} s")
        return torch.load(out, weights_only=False)


class ExchangeCounter:
    """Counts the bytes each rank's attention sends through diffusers' Ulysses all-to-all and ring exchanges
    (wraps ``attention_dispatch._all_to_all_single`` and ``funcol.all_gather_tensor`` while entered)."""

    def __init__(self) -> None:
        self.bytes = 0
        self.steps: list[int] = []  # the bytes of each model call (marked by the caller)

    def mark(self) -> None:
        """A model call ended: its bytes are those since the last mark."""
        self.steps.append(self.bytes - sum(self.steps))

    def __enter__(self) -> ExchangeCounter:
        from diffusers.models import attention_dispatch as ad

        self._module, self._original = ad, ad._all_to_all_single
        original = self._original

        def counted(x: torch.Tensor, group: Any) -> torch.Tensor:
            world = torch.distributed.get_world_size(group)
            self.bytes += x.numel() * x.element_size() * (world - 1) // world  # what leaves this rank
            return original(x, group)

        def gathered(x: torch.Tensor, gather_dim: int, group: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
            if sys._getframe(1).f_globals.get("__name__") == ad.__name__:  # a ring's keys/values (not an output's gather)
                self.bytes += x.numel() * x.element_size() * (torch.distributed.get_world_size(group) - 1)  # to every other rank
            with warnings.catch_warnings():  # (its deprecation, said of this wrapper rather than of diffusers)
                warnings.simplefilter("ignore", FutureWarning)
                return gather(x, gather_dim, group, *args, **kwargs)

        gather = self._gather = ad.funcol.all_gather_tensor
        ad._all_to_all_single = counted
        ad.funcol.all_gather_tensor = gathered
        return self

    def __exit__(self, *exc: Any) -> None:
        self._module._all_to_all_single = self._original
        self._module.funcol.all_gather_tensor = self._gather


def _patched(model: torch.nn.Module, spec: str | None) -> Any:
    import contextlib

    from .specs import PatchSpec

    return contextlib.nullcontext() if spec is None else PatchSpec.parse(spec).applied(model)


ENGINES = ("diffusers", "cache-dit")


class UnderContextParallelism:
    """``with``: Ulysses context parallelism over ``world`` ranks enabled on ``model`` — by diffusers'
    ``enable_parallelism`` (``config``: its ContextParallelConfig options) or by cache-dit's own engine — and ``spec``
    applied before (``patch_first``) or after; the patch is removed on exit."""

    def __init__(
        self, model: torch.nn.Module, spec: str | None, patch_first: bool, world: int, engine: str = "diffusers", **config: Any
    ) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        self.model, self.spec, self.patch_first, self.world, self.engine = model, spec, patch_first, world, engine
        self.config = config or {"ulysses_degree": world}

    def __enter__(self) -> torch.nn.Module:
        self.applied = _patched(self.model, self.spec)
        if self.patch_first:
            self.applied.__enter__()
        if self.engine == "cache-dit":
            import cache_dit

            cache_dit.enable_cache(self.model, cache_config=None, parallelism_config=cache_dit.ParallelismConfig(ulysses_size=self.world))
        else:
            from diffusers import ContextParallelConfig

            self.model.enable_parallelism(config=ContextParallelConfig(**self.config))
        if not self.patch_first:
            self.applied.__enter__()
        return self.model

    def __exit__(self, *exc: Any) -> None:
        self.applied.__exit__(*exc)


def _one_process(
    name: str, height: int, width: int, specs: tuple[str, ...], frames: int | None, small: bool, blocks: int | None, steps: int = 1
) -> tuple[torch.nn.Module, Callable[..., torch.Tensor], dict[str | None, torch.Tensor]]:
    """The family's example model, a forward of a model on the example's inputs (batch 1, seeded alike on every
    rank), and the single-process output of vanilla (key None) and of each spec. ``steps`` > 1: the forward is a
    generation of that many Euler steps from pure noise (what a method acting across steps needs), its last output."""
    import tokenmerge

    from .architectures import at_noise, build_model, timestep_scale, transformer_inputs, transformer_output

    model = build_model(name, small=small, seed=0, blocks=blocks)
    inputs = transformer_inputs(model, name, height, width, batch=1, seed=1, frames=frames)

    def call(m: torch.nn.Module, step_inputs: dict[str, Any]) -> torch.Tensor:
        return transformer_output(name, m(**{**step_inputs, "return_dict": False}))

    def forward(m: torch.nn.Module, counter: ExchangeCounter | None = None) -> torch.Tensor:
        with torch.no_grad():
            if steps == 1:
                return call(m, inputs)
            scale, x = timestep_scale(m), inputs["hidden_states"]
            with tokenmerge.generation(m):
                for i in range(steps):
                    out = call(m, {**at_noise(inputs, scale, 1 - i / steps), "hidden_states": x})
                    x = x - out.reshape(x.shape) / steps
                    if counter is not None:
                        counter.mark()
            return x

    single = {None: forward(model)}
    for spec in specs:
        with _patched(model, spec):
            single[spec] = forward(model)
    return model, forward, single


def compare_family(
    rank: int,
    world: int,
    name: str,
    height: int,
    width: int,
    specs: tuple[str, ...],
    frames: int | None = None,
    orders: tuple[bool, ...] = (False,),
    repeats: int = 0,
    small: bool = True,
    blocks: int | None = None,
    config: dict[str, Any] | None = None,
    engine: str = "diffusers",
    steps: int = 1,
) -> dict[str, Any]:
    """One family's model (batch 1), vanilla and under each spec: in one process (every rank computes it, the
    same) and under context parallelism over ``world`` ranks (Ulysses unless ``config`` says otherwise), with
    tokenmerge applied after (``orders`` False) and/or before (True) ``enable_parallelism``. Per run: the relative
    L2 of the parallel output against the single-process output of the same spec and against vanilla (and of the
    single-process output against vanilla: what the method changes in one process), the bytes
    this rank's attention sent (in all, and per call where ``steps`` > 1: a generation of that many steps, its last
    latent compared), the tokenmerge warnings, and (``repeats``) this rank's median forward seconds."""
    import copy

    model, forward, single = _one_process(name, height, width, specs, frames, small, blocks, steps)
    rows = []
    for patch_first in orders:
        for spec in (None, *specs):
            target = copy.deepcopy(model)
            with (
                warnings.catch_warnings(record=True) as caught,
                UnderContextParallelism(target, spec, patch_first, world, engine, **(config or {})),
            ):
                warnings.simplefilter("always")
                with ExchangeCounter() as counter:
                    out = forward(target, counter)
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    forward(target)
                    times.append(time.perf_counter() - t0)
            reference = single[spec]
            rows.append(
                {
                    "spec": spec or "vanilla",
                    "patch_first": patch_first,
                    "rel_l2_single": float((out - reference).norm() / reference.norm()),
                    "rel_l2_vanilla": float((out - single[None]).norm() / single[None].norm()),
                    "single_vanilla": float((reference - single[None]).norm() / single[None].norm()),  # one process's effect
                    "bytes": counter.bytes,
                    "step_bytes": counter.steps,
                    "seconds": statistics.median(times) if times else None,
                    "warnings": sorted({str(w.message) for w in caught if "tokenmerge" in str(w.message)}),
                    "output": out,
                }
            )
    return {"world": world, "rank": rank, "rows": rows}


def bench_family(
    rank: int,
    world: int,
    name: str,
    height: int,
    width: int,
    specs: tuple[str, ...],
    frames: int | None,
    repeats: int,
    small: bool,
    blocks: int | None,
    steps: int = 1,
) -> list[dict[str, Any]]:
    """``tokenmerge bench --cp``: one model under Ulysses over ``world`` ranks, tokenmerge applied after
    ``enable_parallelism`` and removed again per variant, vanilla and each spec timed in rounds that rotate their
    order; per rank and variant: the median and range of its forward seconds (``steps`` > 1: of a generation of that
    many calls) and the bytes its attention sent per call (the mean, and the fewest: a cached step's), and the
    relative L2 of its output against one process's output of the same spec (every rank runs the single-process
    forwards first). Every rank's rows (gathered to all ranks)."""
    import torch.distributed as dist
    from diffusers import ContextParallelConfig

    model, forward_of, single = _one_process(name, height, width, specs, frames, small, blocks, steps)
    forward = functools.partial(forward_of, model)
    variants = (None, *specs)
    model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
    times: dict[str | None, list[float]] = {spec: [] for spec in variants}
    sent: dict[str | None, list[int]] = {}
    errors: dict[str | None, float] = {}
    for round_index in range(max(1, repeats) + 1):  # round 0 warms up and measures bytes and errors
        shift = round_index % len(variants)
        for spec in variants[shift:] + variants[:shift]:
            with _patched(model, spec):
                dist.barrier()
                with ExchangeCounter() as counter:
                    t0 = time.perf_counter()
                    out = forward(counter)
                    seconds = time.perf_counter() - t0
            if round_index == 0:
                sent[spec] = counter.steps or [counter.bytes]
                errors[spec] = float((out - single[spec]).norm() / single[spec].norm())
            if round_index > 0 or repeats == 0:
                times[spec].append(seconds)
    rows = [
        {
            "rank": rank,
            "spec": spec or "vanilla",
            "median": statistics.median(times[spec]),
            "min": min(times[spec]),
            "max": max(times[spec]),
            "bytes": statistics.mean(sent[spec]),
            "fewest_bytes": min(sent[spec]),
            "rel_l2_single": errors[spec],
        }
        for spec in variants
    ]
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, rows)
    return [row for part in gathered for row in part]


def format_bench(rows: list[dict[str, Any]], label: str, world: int, steps: int = 1) -> str:
    """Per variant and rank: median seconds (min-max), speed-up against vanilla on that rank, bytes sent per
    call (and their share of vanilla's; over a generation: the mean and a cached step's), and the output's distance
    from one process's."""
    base = {row["rank"]: row for row in rows if row["spec"] == "vanilla"}
    loop = steps > 1
    what = f"a generation of {steps} calls" if loop else "forward"
    lines = [
        f"{label}, Ulysses over {world} ranks (gloo, CPU), one thread per rank, batch 1",
        f"| variant | rank | {what} s (min-max) | speed-up | attention bytes sent per call | of vanilla's |"
        + (" fewest (a cached step) |" if loop else "")
        + " rel. L2 vs one process |",
        "|---|---|---|---|---|---|" + ("---|" if loop else "") + "---|",
    ]
    for row in rows:
        b = base[row["rank"]]
        fewest = f" {row['fewest_bytes'] / 2**20:.2f} MiB ({row['fewest_bytes'] / max(b['fewest_bytes'], 1):.0%}) |" if loop else ""
        lines.append(
            f"| {row['spec']} | {row['rank']} | {row['median']:.3f} ({row['min']:.3f}-{row['max']:.3f}) | {b['median'] / row['median']:.2f}x | "
            f"{row['bytes'] / 2**20:.2f} MiB | {row['bytes'] / max(b['bytes'], 1):.0%} |{fewest} {row['rel_l2_single']:.1e} |"
        )
    return "\n".join(lines)
