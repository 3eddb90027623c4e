"""Find the denoisers and spatial transformer blocks of any supported model object.

Accepted: a diffusers ``DiffusionPipeline`` (every component with supported blocks: the UNet, each
ControlNet, ...), a diffusers ``ModelMixin`` with ``BasicTransformerBlock``s, the latent-diffusion
object the webui passes (``model.model.diffusion_model``) and a bare ``ldm``/``sgm`` ``UNetModel``.
Classes are recognised by name along the MRO, so neither diffusers nor ldm has to be importable.
"""

from __future__ import annotations

import torch

from . import diffusers, ldm
from .base import DenoiserLayout, SpatialContainer, has_class_named, transformer_blocks

__all__ = ["DenoiserLayout", "SpatialContainer", "find_denoisers", "patch_root", "ACCEPTED"]

_FAMILIES = (diffusers, ldm)

ACCEPTED = (
    "a diffusers DiffusionPipeline, a diffusers ModelMixin with BasicTransformerBlocks (UNet2DConditionModel, "
    "ControlNetModel, UNetMotionModel, ...), a latent-diffusion object with .model.diffusion_model (as the webui "
    "passes), or an ldm/sgm UNetModel"
)


def patch_root(model: object) -> torch.nn.Module:
    """What tomesd's ``remove_patch`` returns: a pipeline's ``unet``, else the model itself."""
    unet = getattr(model, "unet", None)
    return model if unet is None else unet  # type: ignore[return-value]


def _candidates(model: object) -> list[torch.nn.Module]:
    if has_class_named(model, "DiffusionPipeline"):
        components = getattr(model, "components", {}) or {}
        return [m for m in components.values() if isinstance(m, torch.nn.Module)]
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"tokenmerge cannot patch a {type(model).__name__}; expected {ACCEPTED}")
    inner = getattr(getattr(model, "model", None), "diffusion_model", None)
    return [inner] if isinstance(inner, torch.nn.Module) else [model]


def _layouts_in(candidate: torch.nn.Module) -> list[DenoiserLayout]:
    layouts: list[DenoiserLayout] = []
    claimed: set[int] = set()
    for module in candidate.modules():
        for family in _FAMILIES:
            if family.is_denoiser(module) and id(module) not in claimed:
                found = [c for c in family.containers(module) if c.blocks and id(c.module) not in claimed]
                if found:
                    layouts.append(DenoiserLayout(module, found))
                    claimed.update(id(c.module) for c in found)
    # Spatial transformers outside any UNet (a bare Transformer2DModel, say) sit at level 1.
    loose = [
        SpatialContainer(m, blocks, 1)
        for m in candidate.modules()
        for family in _FAMILIES
        if family.is_container(m) and id(m) not in claimed and (blocks := transformer_blocks(m))
    ]
    if loose:
        layouts.append(DenoiserLayout(candidate, loose))
    return layouts


def compiled_parts(model: object) -> list[str]:
    """Names of the ``torch.compile`` wrappers (``OptimizedModule``) in ``model``'s modules."""
    return [name or type(c).__name__ for c in _candidates(model) for name, m in c.named_modules() if type(m).__name__ == "OptimizedModule"]


def find_denoisers(model: object) -> list[DenoiserLayout]:
    """Every denoiser of ``model`` with at least one supported block; ``TypeError`` if there is none."""
    candidates = _candidates(model)
    layouts = [layout for c in candidates for layout in _layouts_in(c)]
    if not layouts:
        unsupported = sorted({type(m).__name__ for c in candidates for m in c.modules() if transformer_blocks(m)})
        found = f"; its transformer blocks sit in {', '.join(unsupported)}, which tokenmerge does not support yet" if unsupported else ""
        raise TypeError(
            f"{type(model).__name__} has no transformer blocks that tokenmerge can patch{found}. "
            f"Supported blocks live in a diffusers Transformer2DModel / TransformerSpatioTemporalModel or an "
            f"ldm/sgm SpatialTransformer; tokenmerge accepts {ACCEPTED}"
        )
    return layouts
