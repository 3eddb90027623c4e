"""The methods, as data and code: one module each (:mod:`.tome`, :mod:`.todo`, :mod:`.auto`, :mod:`.tokencache`), each a
:class:`~tokenmerge.methods.base.Method` declaring the options it reads, its per-block decision, what ``describe()``
prints, the routes it runs on and the options it declares (:data:`OPTIONS`, from which the config and every front
end's widgets are made). Adding a method means adding its module and listing it here; nothing outside this package
compares method names (the CLI's parsing of specs aside)."""

from __future__ import annotations

import dataclasses

from ..options import COMMON, Option
from .auto import AUTO_MAX_NOISE, Auto, auto_kv_factor, auto_kv_factors
from .base import IDLE, ROUTES, BlockAction, BlockFacts, Method, PlanStore, ThreadGenerations, idle
from .todo import ToDo
from .tokencache import TokenCache
from .tome import ToMe, merge_count, plan_merge, window_of

REGISTRY: dict[str, Method] = {m.name: m for m in (ToMe(), ToDo(), Auto(), TokenCache())}
METHODS: tuple[str, ...] = tuple(REGISTRY)
# How blocks are reduced: what each method does, in the registry's order.
SUMMARY = ", ".join(f"{m.name} {m.summary}" for m in REGISTRY.values())
# Every option: those every method reads, then each method's own, in the registry's order (tokenmerge.options).
OPTIONS: dict[str, Option] = {
    o.name: o
    for o in (
        dataclasses.replace(COMMON[0], choices=METHODS, help=f"{COMMON[0].help}: {SUMMARY}"),
        *COMMON[1:],
        *(o for m in REGISTRY.values() for o in m.options),
    )
}
# The method declaring each option (None: every method reads it).
OWNERS: dict[str, str | None] = {name: next((m.name for m in REGISTRY.values() if o in m.options), None) for name, o in OPTIONS.items()}


def get(name: str) -> Method:
    """The method named ``name`` (a validated config's ``method``)."""
    return REGISTRY[name]


def methods_on(*routes: str) -> tuple[str, ...]:
    """The methods that run on any of ``routes`` (:data:`~tokenmerge.methods.base.ROUTES`): what a front end offers."""
    return tuple(name for name, method in REGISTRY.items() if set(routes) & set(method.routes))


__all__ = [
    "AUTO_MAX_NOISE",
    "IDLE",
    "METHODS",
    "OPTIONS",
    "OWNERS",
    "REGISTRY",
    "ROUTES",
    "SUMMARY",
    "BlockAction",
    "BlockFacts",
    "Method",
    "PlanStore",
    "ThreadGenerations",
    "auto_kv_factor",
    "auto_kv_factors",
    "get",
    "idle",
    "merge_count",
    "methods_on",
    "plan_merge",
    "window_of",
]
