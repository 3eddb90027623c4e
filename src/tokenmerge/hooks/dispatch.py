"""The diffusers route of key/value downsampling: every ``dispatch_attention_fn`` backend, CPU and GPU alike.

diffusers' attention processors (Flux, Flux.2, Qwen-Image, Z-Image, Chroma, Wan, ...) compute attention through
``dispatch_attention_fn``, which looks its backend function up in ``_AttentionBackendRegistry._backends`` at every
call and calls it with keywords on (B, S, H, D) tensors. Each registered function is wrapped once (on the first
patch of a model with key/value sites; restored when the last such patch is removed): the wrapper is a
pass-through unless this thread has an open :class:`~tokenmerge.hooks.attention.ReduceKeysValues` (entered by an
attention's pre-hook for the duration of that attention's call), in which case the keys, values and mask columns
it receives are reduced before the backend runs — native SDPA, ``_native_math``, flex, flash, sage, xformers, a
hub kernel — so the reduction does not depend on the backend a user picked. Causal calls are left alone.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any


class _Active(threading.local):
    def __init__(self) -> None:
        self.stack: list[Any] = []  # mutated in place, never rebound: the form torch.compile keeps


ACTIVE = _Active()
_users = 0
_lock = threading.Lock()


def exit_mode(mode: Any) -> None:
    """Leave a key/value reduction mode (hooks.attention.ReduceKeysValues) and this thread's stack of them."""
    mode.__exit__(None, None, None)
    if ACTIVE.stack and ACTIVE.stack[-1] is mode:
        ACTIVE.stack.pop()


def _registries() -> list[Any]:
    """diffusers' backend registry, and cache-dit's where cache-dit is in use (its processors for Wan, HunyuanVideo,
    LTX and others call its own dispatcher, with diffusers' keyword form; tokenmerge never imports it)."""
    found = []
    try:
        from diffusers.models.attention_dispatch import _AttentionBackendRegistry

        found.append(_AttentionBackendRegistry)
    except ImportError:  # no diffusers (ldm, ComfyUI): nothing to route
        pass
    cache_dit = sys.modules.get("cache_dit.attention.backends.register")
    if cache_dit is not None:
        found.append(getattr(cache_dit, "_AttnBackendRegistry", None))
    return [r for r in found if r is not None and isinstance(getattr(r, "_backends", None), dict)]


def _wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def reduce_then_attend(**kwargs: Any) -> Any:
        stack = ACTIVE.stack
        if not stack or kwargs.get("is_causal", False) or "key" not in kwargs:
            return fn(**kwargs)
        mode = stack[-1]
        found = mode.reduce(kwargs["key"].transpose(1, 2), kwargs["value"].transpose(1, 2), kwargs.get("attn_mask"))
        if found is not None:
            key, value, mask = found
            kwargs["key"], kwargs["value"] = key.transpose(1, 2), value.transpose(1, 2)
            if "attn_mask" in kwargs:
                # diffusers' flex backend reads a 2-D mask as per query; as (B, 1, 1, S_kv) it means the keys.
                kwargs["attn_mask"] = mask[:, None, None, :] if name == "flex" and mask is not None and mask.ndim == 2 else mask
        mode.dispatching += 1
        try:
            return fn(**kwargs)
        finally:
            mode.dispatching -= 1

    reduce_then_attend._tokenmerge_wrapped = fn  # type: ignore[attr-defined]
    return reduce_then_attend


def _wrap_all(registries: list[Any]) -> None:
    for registry in registries:
        for key, fn in list(registry._backends.items()):
            if getattr(fn, "_tokenmerge_wrapped", None) is None:
                registry._backends[key] = _wrap(getattr(key, "value", str(key)), fn)


def acquire() -> None:
    """A patch with key/value sites begins: wrap every registered backend (once for all patches)."""
    global _users
    with _lock:
        _users += 1
        _wrap_all(_registries())


def ensure_wrapped() -> None:
    """While patches hold the route, wrap any backend registered (or re-registered) since: cache-dit's engine, for
    one, writes its own functions over diffusers' registry when its parallelism is enabled after tokenmerge."""
    if _users == 0:
        return
    registries = _registries()
    if all(getattr(fn, "_tokenmerge_wrapped", None) is not None for r in registries for fn in r._backends.values()):
        return
    with _lock:
        _wrap_all(registries)


def release() -> None:
    """Such a patch is removed: with none left, every backend function is the original again."""
    global _users
    with _lock:
        _users = max(0, _users - 1)
        if _users == 0:
            for registry in _registries():
                for key, fn in list(registry._backends.items()):
                    registry._backends[key] = getattr(fn, "_tokenmerge_wrapped", fn)


def wrapped() -> bool:
    """Whether the backends are wrapped now (tests)."""
    return any(getattr(f, "_tokenmerge_wrapped", None) for r in _registries() for f in r._backends.values())
