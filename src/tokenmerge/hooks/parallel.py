"""diffusers' context (sequence) parallelism as the hooks see it.

``model.enable_parallelism(config=ContextParallelConfig(...))`` sets ``model._parallel_config`` and wraps the
modules its ``_cp_plan`` names so that they split their inputs across ranks inside their forward. tokenmerge's
pre-hooks run before that wrapped forward, so a container reads the whole call (grid, text, references) and its
layout is cut here to the rank's part (:func:`tokenmerge.algorithms.shard_layout`); a block whose own inputs the
plan splits (Qwen-Image's and Wan's first block) is handed the whole sequence and plans on its rank's chunk. The
state is read at each call, so tokenmerge may be applied before or after ``enable_parallelism``. cache-dit's own
context-parallel engine (``cache_dit.enable_cache(..., parallelism_config=...)``) records its split the same way
and is read alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ContextSplit:
    rank: int
    world: int
    text_split: bool  # the plan splits encoder_hidden_states (the text of a joint attention)
    uneven: bool  # ulysses_anything / ring_anything: tensor_split chunks, any length
    ring: bool

    def chunk(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's chunk of ``x``, as diffusers cuts it."""
        parts = x.tensor_split(self.world, dim) if self.uneven else x.chunk(self.world, dim)
        return parts[self.rank]


def context_split(root: torch.nn.Module) -> ContextSplit | None:
    """The context-parallel split ``root`` runs under now (None: one process, or no context parallelism)."""
    config = getattr(root, "_parallel_config", None)
    # diffusers: a ParallelConfig holding the ContextParallelConfig; cache-dit's engine sets its own config there
    cp = getattr(config, "context_parallel_config", config)
    mesh = getattr(cp, "_flattened_mesh", None)
    if cp is None or mesh is None or not torch.distributed.is_initialized():
        return None
    world = mesh.size()
    if world < 2:
        return None
    plan: dict[str, Any] = getattr(root, "_cp_plan", None) or {}
    text_split = any(isinstance(entry, dict) and "encoder_hidden_states" in entry for entry in plan.values())
    uneven = bool(getattr(cp, "ulysses_anything", False) or getattr(cp, "ring_anything", False))
    rank = torch.distributed.get_rank(mesh.get_group())
    return ContextSplit(rank, world, text_split, uneven, getattr(cp, "ring_degree", 1) > 1)
