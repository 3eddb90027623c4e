"""Host reads (a device sync each on a GPU) that a patch adds to a model call: at most one per call (its timestep),
none per block, and one more per generation where a family reads its token layout from position ids (Flux's
``img_ids``: read once per ids tensor, which a pipeline passes at every step).

Counted through a ``TorchFunctionMode`` over every way a tensor's value reaches Python (``item``, ``tolist``,
``bool``, ``float``, ``int``, ``numpy``, ``cpu``), as the patched call's count less the unpatched call's, on every
call of a generation.
"""

from __future__ import annotations

import pytest
import torch
from test_tokencache import generation, model_of, run
from torch.overrides import TorchFunctionMode

import tokenmerge

READS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.__bool__,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
    torch.Tensor.__index__,
    torch.Tensor.numpy,
    torch.Tensor.cpu,
}


class HostReads(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _reads_per_call(name: str, calls: list[dict]) -> list[int]:
    found = []
    for inputs in calls:
        with HostReads() as reads:
            run(name, [inputs])
        found.append(reads.count)
    return found


@pytest.mark.parametrize(
    "options",
    [
        dict(method="tokencache", recompute=0.25, full_steps=1, refresh_every=3),
        dict(method="tokencache"),
        dict(method="auto"),
        dict(ratio=0.5, reuse_steps=2),
    ],
    ids=["tokencache", "tokencache-default", "auto-gate", "tome-reuse"],
)
@pytest.mark.parametrize("name", ["flux", "wan"])
def test_a_patched_call_reads_the_host_at_most_once(name, options):
    calls = generation(name, calls=6)
    vanilla = _reads_per_call(name, calls)
    with tokenmerge.patched(model_of(name), **options):
        patched = _reads_per_call(name, calls)
    added = [p - v for p, v in zip(patched, vanilla)]
    assert added[0] <= 2 and all(n <= 1 for n in added[1:]), (patched, vanilla)
