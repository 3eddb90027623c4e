"""Guarantee: one patched model shared by several threads gives every call exactly its sequential result.

A server shares one pipeline between request threads; tokenmerge keeps everything about one call (timestep,
token grids, plans, merged spans) on a stack that belongs to the calling thread.
"""

from __future__ import annotations

import threading

import pytest
import torch

import tokenmerge

from conftest import sd_inputs

# (height, width, batch, timestep) of the calls each thread makes; threads differ in shapes and timesteps.
THREAD_CALLS = [
    [(16, 16, 2, 900), (16, 16, 2, 800), (16, 16, 2, 700)],
    [(16, 24, 1, 999), (16, 24, 1, 500), (16, 24, 1, 400)],
    [(24, 16, 2, 600), (16, 16, 3, 600), (24, 16, 2, 300)],
]


def _inputs(unet, h, w, b, t):
    inputs = sd_inputs(unet, h, w, batch=b, seed=h * 100 + w + b)
    return dict(inputs, timestep=torch.tensor(t))


def _run_sequence(unet, calls):
    with torch.no_grad():
        return [unet(**_inputs(unet, *c)).sample for c in calls]


def _in_fresh_thread(fn):
    """Run ``fn`` alone in a new thread (per-thread plan caches start empty, as in a concurrent run)."""
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("out", fn()))
    thread.start()
    thread.join()
    return box["out"]


@pytest.mark.parametrize(
    "options",
    [
        dict(ratio=0.5),
        dict(method="todo", kv_factor=2),
        dict(method="auto", auto_max_keys=64, auto_min_tokens=64),
        dict(ratio=0.5, share_plan=True),
        dict(ratio=0.5, reuse_steps=2, share_plan=True),
        dict(ratio=0.5, merge_crossattn=True, merge_mlp=True),
    ],
)
def test_concurrent_calls_equal_sequential_calls(sd15_small, options):
    with tokenmerge.patched(sd15_small, max_downsample=2, **options):
        # Each thread's workload: its calls twice over (so that the threads' calls interleave).
        workloads = [calls * 2 for calls in THREAD_CALLS]
        expected = [_in_fresh_thread(lambda w=w: _run_sequence(sd15_small, w)) for w in workloads]
        results: dict[int, list[torch.Tensor]] = {}
        errors: list[BaseException] = []
        start = threading.Barrier(len(THREAD_CALLS))

        def worker(i: int) -> None:
            try:
                start.wait()
                results[i] = _run_sequence(sd15_small, workloads[i])
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(THREAD_CALLS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    for i, calls in enumerate(expected):
        for got, want in zip(results[i], calls):
            assert torch.equal(got, want)
