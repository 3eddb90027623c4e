"""What an adapter tells the patcher about one denoiser: where its spatial transformers are."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


def has_class_named(obj: object, *names: str) -> bool:
    """True if any class in ``obj``'s MRO has one of ``names``: no import of the model library needed."""
    return any(cls.__name__ in names for cls in type(obj).__mro__)


@dataclass
class SpatialContainer:
    """A module whose input is a (B, C, H, W) map and whose ``blocks`` see its H*W tokens.

    ``level`` is the downsampling factor of that map relative to the denoiser's latent input (1 at
    the top level of a UNet), known from the UNet's structure rather than guessed from token counts.
    """

    module: torch.nn.Module
    blocks: list[torch.nn.Module]
    level: int


@dataclass
class DenoiserLayout:
    """A denoiser (UNet, ControlNet, ...) and its spatial transformers, in execution order."""

    root: torch.nn.Module
    containers: list[SpatialContainer] = field(default_factory=list)
    timestep_names: tuple[str, ...] = ("timestep", "timesteps", "t")

    @property
    def top_level(self) -> int:
        return min(c.level for c in self.containers)

    def timestep_arg(self) -> tuple[str, int] | None:
        """Name and positional index of the timestep parameter of ``root.forward``, if it has one."""
        params = [
            p
            for p in inspect.signature(self.root.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        for index, p in enumerate(params):
            if p.name in self.timestep_names:
                return p.name, index
        return None


def containers_in(
    block: torch.nn.Module | None, level: int, is_container: Callable[[torch.nn.Module], bool]
) -> list[SpatialContainer]:
    """The spatial transformers inside one UNet block, all at that block's resolution ``level``."""
    if block is None:
        return []
    return [SpatialContainer(m, transformer_blocks(m), level) for m in block.modules() if is_container(m)]


def transformer_blocks(container: torch.nn.Module) -> list[torch.nn.Module]:
    """The spatial ``BasicTransformerBlock``s of a container (temporal blocks have other classes)."""
    blocks = getattr(container, "transformer_blocks", None) or []
    return [b for b in blocks if has_class_named(b, "BasicTransformerBlock")]
