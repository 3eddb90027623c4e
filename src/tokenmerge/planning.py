"""What each block does in one call: the single decision shared by every front end.

The hooks (diffusers, ldm/sgm, every transformer family), the ComfyUI patch callables and ``describe()`` gather the
facts (:class:`~tokenmerge.methods.BlockFacts`: the block's level, its token grid, the call's noise level, the tokens
to match on, context parallelism's split) and call :func:`decide` once per block; they never decide themselves. The
checks every method shares are made here, then the method acts (:mod:`tokenmerge.methods`).
"""

from __future__ import annotations

import torch

from .algorithms import hash_ints
from .config import TokenMergeConfig
from .methods import IDLE, BlockAction, BlockFacts, idle
from .steps import StepPosition, counts_steps

_BLOCK_SALT = 0x70E
# How far above max_noise a call still counts as reduced: half of bfloat16's spacing near 1, so that a timestep the
# pipeline passed in bfloat16 counts as its step (t / 1000 = 0.4 arrives as 0.40039).
NOISE_TOLERANCE = 2**-9

__all__ = ["IDLE", "NOISE_TOLERANCE", "BlockAction", "BlockFacts", "block_key", "decide", "gate_reason", "gated", "noise_level"]


def block_key(*identity: int) -> int:
    """The random-partition key of a block from its identity (index, or ComfyUI's stage/index/block)."""
    return hash_ints(_BLOCK_SALT, *identity)


def noise_level(timestep: torch.Tensor | list[float], scale: tuple[float, float]) -> float:
    """The noise level of a call, 1 = pure noise and 0 = clean, from its ``timestep`` (or its values, read already)
    and the family's ``scale`` (the timestep's value at pure noise and when clean: (1000, 0) for most models, (1, 0)
    where the pipeline divides by 1000, (0, 1) where it counts from noise to clean). The noisiest of the call's entries
    decides (a per-token timestep marks a clean condition frame with 0; the sample's step is the largest). One host
    read of a tensor."""
    noisy, clean = scale
    if isinstance(timestep, torch.Tensor):
        extreme = float(timestep.detach().max() if noisy > clean else timestep.detach().min())
    else:
        extreme = max(timestep) if noisy > clean else min(timestep)
    return (extreme - clean) / (noisy - clean)


def gated(config: TokenMergeConfig, noise: float | None, position: StepPosition | None = None) -> bool:
    """Whether the gate leaves a call whole. On a few-step schedule (``position``, :mod:`tokenmerge.steps`) under a
    method's default gate with a few-step rule: unless the step is among the last ``few_step_share`` of them. Else by
    its ``noise`` level: above ``max_noise`` (the method's default where unset) by more than :data:`NOISE_TOLERANCE`
    (0.4 admits up to 0.40195: a step at t = 401 of 1000, where DDIM's leading spacing puts one, is reduced); ``None``
    (not read) is never gated."""
    if counts_steps(config, position):
        return not position.in_last(config.few_step_share)
    return noise is not None and config.noise_limit < 1 and noise > config.noise_limit + NOISE_TOLERANCE


def gate_reason(config: TokenMergeConfig, position: StepPosition | None) -> str:
    """Why :func:`gated` leaves a call whole, in a few words."""
    if counts_steps(config, position):
        return f"step {position.index + 1} of a {position.total}-step schedule, before its last {config.few_step_share:.0%}"
    return f"noise level above max_noise={config.noise_limit:g}"


def decide(config: TokenMergeConfig, facts: BlockFacts) -> BlockAction:
    """The block's action in this call, made once for every front end and for ``describe()``.

    Nothing (with the reason) where the options are the identity, the level is not patched, the grid is unknown, the
    call is noisier than ``max_noise``, a rank's part of the grid cannot be reduced as the method needs (said once,
    through ``facts.notes``), or, for a method whose spans run on gathered tokens, a step cache decides by this block's output (reduced, that
    output would carry an error that changes from step to step by more than the cache's threshold, and the cache
    would reuse no step; key/value methods reduce the same way at every step and the cache still reuses steps); else
    the method's own action (:meth:`tokenmerge.methods.Method.act`), and what of it cannot act on this grid (said
    once)."""
    method = config.method_of
    if config.is_identity:
        return idle("identity options")
    if not config.merges_level(facts.level, facts.top_level):
        return idle("level not patched")
    if facts.grid is None:
        return IDLE
    if gated(config, facts.noise, facts.position):
        return idle(gate_reason(config, facts.position))
    if facts.shard is not None and (refused := method.on_shard(config, facts.shard)):
        facts.notes.append(("parallel", f"under context parallelism, {refused}; its blocks run unchanged"))
        return idle("rank's part not reducible")
    if method.gathers and facts.decider is not None and (decider := facts.decider()) is not None:
        facts.notes.append(
            (
                "deciding cache",
                f"{decider} whether to run the rest; reduced, that output would carry {method.name}'s error, which changes "
                f"from step to step by more than the cache's threshold, and the cache would reuse no step: {method.name} leaves "
                "them whole",
            )
        )
        return idle("a step cache decides by its output")
    action = method.act(config, facts)
    void = method.void(config, facts.whole or facts.grid, action)
    if void is not None:
        facts.notes.append((f"block: {void[0]}", void[1]))
    return action
