"""Find the denoisers of any supported model object, one adapter per model family.

Accepted: a diffusers ``DiffusionPipeline`` (every component with supported blocks: the UNet or
transformer, each ControlNet, ...), a diffusers model (UNet, SD3, Flux, PixArt, DiT, ControlNets), the
latent-diffusion object the webui passes (``model.model.diffusion_model``) and a bare ``ldm``/``sgm``
``UNetModel``. Classes are recognised by name along the MRO, so no model library has to be importable.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import ldm, transformers, unet
from .base import BlockLayout, Container, DenoiserLayout, KeyValueSite, Span, has_class_named

__all__ = ["ACCEPTED", "BlockLayout", "Container", "DenoiserLayout", "Discovery", "KeyValueSite", "Span", "discover", "roots_of"]

# Tried in this order on every module, outermost first; a module claimed by one family is not searched again.
_FAMILIES = (
    transformers.sd3_layout,
    transformers.flux_layout,
    transformers.patch_transformer_layout,
    unet.layout,
    ldm.layout,
    unet.loose_container,
)

ACCEPTED = (
    "a diffusers DiffusionPipeline, a diffusers UNet (UNet2DConditionModel, ControlNetModel, UNetMotionModel, ...), an "
    "SD3, Flux, PixArt or DiT transformer (and their ControlNets), a latent-diffusion object with .model.diffusion_model "
    "(as the webui passes), or an ldm/sgm UNetModel"
)


def roots_of(model: object) -> list[torch.nn.Module]:
    """The modules of ``model`` that may hold denoisers: a pipeline's components, the webui object's
    ``model.diffusion_model``, or the module itself."""
    if has_class_named(model, "DiffusionPipeline"):
        components = getattr(model, "components", {}) or {}
        return [m for m in components.values() if isinstance(m, torch.nn.Module)]
    if not isinstance(model, torch.nn.Module):
        return []
    inner = getattr(getattr(model, "model", None), "diffusion_model", None)
    return [inner] if isinstance(inner, torch.nn.Module) else [model]


@dataclass
class Discovery:
    """What one walk over a model found: its denoisers, the torch.compile wrappers inside it, and every module
    (so that patching acts on this walk's result instead of walking the model again)."""

    layouts: list[DenoiserLayout]
    compiled: list[str]
    modules: list[torch.nn.Module]


def discover(model: object) -> Discovery:
    """Every denoiser of ``model`` with at least one supported block (one walk over its modules)."""
    roots = roots_of(model)
    if not roots:
        raise TypeError(f"tokenmerge cannot patch a {type(model).__name__}; expected {ACCEPTED}")
    layouts: list[DenoiserLayout] = []
    claimed: set[int] = set()
    compiled: list[str] = []
    modules: list[torch.nn.Module] = []
    for root in roots:
        for name, module in root.named_modules():
            modules.append(module)
            if type(module).__name__ == "OptimizedModule":
                compiled.append(name or type(module).__name__)
            if id(module) in claimed:
                continue
            for family in _FAMILIES:
                found = family(module)
                if found is not None:
                    layouts.append(found)
                    claimed.update(id(m) for m in found.root.modules())
                    break
    if not layouts:
        raise TypeError(
            f"{type(model).__name__} has no transformer blocks that tokenmerge can patch. Supported: spatial transformers "
            f"of UNets (diffusers Transformer2DModel / TransformerSpatioTemporalModel, ldm/sgm SpatialTransformer) and the "
            f"SD3, Flux, PixArt and DiT transformers; tokenmerge accepts {ACCEPTED}"
        )
    return Discovery(layouts, compiled, modules)
