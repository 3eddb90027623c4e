"""What a key/value site's attention offers the reductions: whether its projections are fused, and whether its keys
and values can be handed to it by keyword (a plain self-attention's ``encoder_hidden_states`` / ``context``)."""

from __future__ import annotations

from typing import Any

import torch


def projections_fused(attention: torch.nn.Module) -> bool:
    """diffusers attention whose q/k/v projections are fused (``fuse_qkv_projections``): no ``to_kv`` for a
    separate key/value source. The processor, not ``fused_projections``, says it (unfusing keeps the flag)."""
    processor = getattr(attention, "processor", None)
    if processor is not None and type(processor).__name__.startswith("Fused"):
        return True
    return bool(getattr(attention, "fused_projections", False)) and not hasattr(attention, "to_kv") and processor is None


def keyword_route(site: Any) -> bool:
    """Whether ``site`` (families.base.KeyValueSite) takes its keys and values from a keyword: a plain self-attention
    whose projections are not fused, which can be handed a key/value source of its own."""
    return site.context_kwarg is not None and not projections_fused(site.module)
