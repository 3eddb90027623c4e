"""Counted work: the multiply-adds of a model's linear layers, matrix products, convolutions and attention, through a
TorchFunctionMode (so that what tokenmerge's own modes reduce, inside it, is counted as it runs). Unlike seconds on a
shared 2-core CPU, the counts do not depend on the machine: the benches print them beside the times.

Counted at the level of torch functions: ``F.linear``, ``matmul`` / ``@``, ``mm``, ``bmm``, ``addmm``, ``baddbmm``,
``F.conv1d/2d/3d`` and ``F.scaled_dot_product_attention`` (query x key and weights x value; a backend that calls none
of these, a fused kernel outside torch, is not counted). Elementwise work (norms, activations, the merge's gathers)
is left out: it is a few percent of a diffusion model's and no method changes its order.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_SDPA = F.scaled_dot_product_attention
_CONV = (F.conv1d, F.conv2d, F.conv3d)
_MATMUL = (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.Tensor.mm, torch.bmm, torch.Tensor.bmm)
_ADD_MATMUL = (torch.addmm, torch.Tensor.addmm, torch.baddbmm, torch.Tensor.baddbmm)


def _matmul(a: torch.Tensor, b: torch.Tensor) -> int:
    """Multiply-adds of ``a @ b`` (1-D operands as a row or a column, batch dimensions broadcast)."""
    a_shape = (1, *a.shape) if a.ndim == 1 else tuple(a.shape)
    b_shape = (*b.shape, 1) if b.ndim == 1 else tuple(b.shape)
    batch = torch.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    return math.prod(batch) * a_shape[-2] * a_shape[-1] * b_shape[-1]


class WorkCounter(TorchFunctionMode):
    """Multiply-adds by kind (``linear``, ``attention``, ``matmul``, ``conv``) while the mode is active."""

    def __init__(self) -> None:
        super().__init__()
        self.macs: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.macs.values())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            self._count(func, args, kwargs)
        except (IndexError, TypeError, RuntimeError):  # a form this counter does not know: not counted
            pass
        return func(*args, **kwargs)

    def _count(self, func: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        if func is F.linear:
            x, weight = args[0], args[1] if len(args) > 1 else kwargs["weight"]
            self.macs["linear"] += x.numel() // x.shape[-1] * weight.shape[0] * weight.shape[1]
        elif func is _SDPA:
            q, k, v = (args + tuple(kwargs.get(n) for n in ("query", "key", "value")[len(args) :]))[:3]
            heads = q.shape[-3] if q.ndim >= 3 else 1
            self.macs["attention"] += math.prod(q.shape[:-3]) * heads * q.shape[-2] * k.shape[-2] * (q.shape[-1] + v.shape[-1])
        elif func in _MATMUL:
            self.macs["matmul"] += _matmul(args[0], args[1])
        elif func in _ADD_MATMUL:
            self.macs["matmul"] += _matmul(args[1], args[2])
        elif func in _CONV:
            x, weight = args[0], args[1] if len(args) > 1 else kwargs["weight"]
            self.macs["conv"] += x.shape[0] * _conv_positions(x, weight, func, args, kwargs) * weight.numel()


def _conv_positions(x: torch.Tensor, weight: torch.Tensor, func: Any, args: tuple, kwargs: dict[str, Any]) -> int:
    """Output positions of a convolution per sample and output channel (its shape, on the meta device)."""
    names = ("stride", "padding", "dilation", "groups")
    options = {n: kwargs[n] for n in names if n in kwargs} | dict(zip(names, args[3:7]))
    probe = func(torch.empty((1, *x.shape[1:]), device="meta"), torch.empty(weight.shape, device="meta"), **options)
    return math.prod(probe.shape[2:])


def count(run: Callable[[], Any]) -> WorkCounter:
    """The multiply-adds of ``run()``."""
    counter = WorkCounter()
    with counter:
        run()
    return counter
