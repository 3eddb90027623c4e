"""The model families tokenmerge patches, as data: one module per family, collected in an explicit registry.

Each module in this package defines ``FAMILY``, a :class:`Family`: the classes it claims (exact class names, looked
up along a module's MRO, nearest class first) or, for UNets whose classes are too many to list, a structural test;
how to lay out one of its denoisers for the generic hooks (:mod:`.base`); its pipelines, capabilities and pixel
scale. A family that cannot gain (linear attention) is registered with the reason it is refused. Adding a family
means adding its module (and, for tests and benchmarks, its examples in :mod:`tokenmerge.tools.examples`); nothing
else lists the families (the README's matrix comes from ``tokenmerge support``).

Accepted objects: a diffusers ``DiffusionPipeline`` (every component with supported blocks), a diffusers model,
the latent-diffusion object the webui passes (``model.model.diffusion_model``) and a bare ``ldm``/``sgm``
``UNetModel``. No model library has to be importable.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..config import METHODS
from .base import BlockLayout, ComfyModel, Container, DenoiserLayout, KeyValueSite, Span, has_class_named

__all__ = [
    "ACCEPTED",
    "BlockLayout",
    "ComfyModel",
    "Container",
    "DenoiserLayout",
    "Discovery",
    "Family",
    "KeyValueSite",
    "Span",
    "comfy_model_of",
    "comfy_models",
    "discover",
    "families",
    "family_of",
    "get",
    "roots_of",
]


@dataclass(frozen=True)
class Family:
    """One model family: what it claims, how it is laid out, and what works on it."""

    name: str  # registry key and bench name: "flux", "qwen-image", ...
    title: str  # for people: "Flux.1", "Qwen-Image"
    classes: tuple[str, ...] = ()  # model classes claimed by exact name (nearest in the MRO wins)
    layout: Callable[[torch.nn.Module], DenoiserLayout | None] | None = None
    matches: Callable[[torch.nn.Module], bool] | None = None  # structural test, for families without a class list
    pipelines: tuple[str, ...] = ()  # diffusers pipelines whose denoiser is of this family
    front_ends: tuple[str, ...] = ("diffusers",)
    methods: tuple[str, ...] = METHODS  # the methods it is patched for (apply_patch refuses the others)
    unsupported: str = ""  # why the other methods are not offered
    cross_attention: bool = False  # a separate text cross-attention exists (merge_crossattn means something)
    refused: str | None = None  # why this family is not patched
    notes: str = ""  # how a call's grid, text and positions are read (support matrix, docs)
    kind: str = "transformer"  # "unet" or "transformer"
    members: tuple[str, ...] = field(default=())  # extra names for the matrix (ControlNets, ...)
    comfy: ComfyModel | None = None  # ComfyUI's implementation of the family, where the node reaches it
    timesteps: tuple[float, float] = (1000.0, 0.0)  # the timestep argument at pure noise and when clean (max_noise)
    # Image size -> token grid for describe(): (px per token side at the highest-resolution level, as the family's
    # pipelines encode and patch, video frames per latent frame after the VAE's causal first one, 0 on images), or a
    # function of the denoiser where its config decides (Wan 2.2 TI2V's VAE compresses twice as much).
    px: tuple[int, int] | Callable[[torch.nn.Module], tuple[int, int]] = (16, 0)

    @property
    def video(self) -> bool:
        """Whether its token grids have a frame axis (st and a (t, h, w) kv_factor act on it)."""
        return callable(self.px) or self.px[1] > 0

    def pixels(self, root: torch.nn.Module) -> tuple[int, int]:
        """(px per token side, video frames per latent frame) of this denoiser."""
        return self.px(root) if callable(self.px) else self.px


def _load() -> dict[str, Family]:
    found: dict[str, Family] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for family in getattr(module, "FAMILIES", None) or (module.FAMILY,):
            if family.name in found:
                raise RuntimeError(f"tokenmerge: two families are named {family.name!r}")
            found[family.name] = family
    claimed: dict[str, str] = {}
    for family in found.values():
        for cls in family.classes:
            if cls in claimed:
                raise RuntimeError(f"tokenmerge: {cls} is claimed by the families {claimed[cls]!r} and {family.name!r}")
            claimed[cls] = family.name
    return found


_REGISTRY = _load()
_BY_CLASS = {cls: family for family in _REGISTRY.values() for cls in family.classes}
_STRUCTURAL = tuple(f for f in _REGISTRY.values() if f.matches is not None)


def families() -> tuple[Family, ...]:
    """Every registered family, in registry order (by name)."""
    return tuple(_REGISTRY.values())


def get(name: str) -> Family:
    if name not in _REGISTRY:
        raise ValueError(f"unknown model family {name!r}; families: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def family_of(module: object) -> Family | None:
    """The family ``module`` belongs to: the one claiming the nearest class of its MRO, else the one structural
    test that holds (two would be an error in the registry, never a silent pick)."""
    for cls in type(module).__mro__:
        family = _BY_CLASS.get(cls.__name__)
        if family is not None:
            return family
    if not isinstance(module, torch.nn.Module):
        return None
    matching = [f for f in _STRUCTURAL if f.matches(module)]
    if len(matching) > 1:
        raise RuntimeError(f"tokenmerge: {type(module).__name__} matches the families {', '.join(f.name for f in matching)}")
    return matching[0] if matching else None


_BY_COMFY_CLASS: dict[str, list[ComfyModel]] = {}
for _family in _REGISTRY.values():
    for _cls in _family.comfy.classes if _family.comfy else ():
        _BY_COMFY_CLASS.setdefault(_cls, []).append(_family.comfy)


def comfy_model_of(diffusion_model: object, image_model: str | None = None) -> ComfyModel | None:
    """The ComfyUI layout of a ComfyUI diffusion model: the one a family gives for the nearest class of its MRO and
    ``image_model`` (the ``unet_config`` entry ComfyUI's model detection writes; where one class serves several
    families, it decides), as this instance lays its tokens out (:meth:`ComfyModel.of_instance`), or None."""
    mro = type(diffusion_model).__mro__
    for cls in mro:
        found = _BY_COMFY_CLASS.get(cls.__name__)
        if found:
            fits = [m for m in found if not m.image_models or image_model in m.image_models]
            fits = [m for m in fits if not any(c.__name__ in m.excludes for c in mro)]
            fits = [m for m in fits if not m.padded_by or m.pad_of(diffusion_model) > 1]  # the instance's own layout
            fits = [m for m in fits if not m.present or getattr(diffusion_model, m.present, None) is not None]
            chosen = min(fits, key=lambda m: not (m.padded_by or m.present), default=None)  # the one its attributes name first
            return chosen.of_instance(diffusion_model) if chosen is not None else None
    return None


def comfy_models() -> tuple[tuple[Family, ComfyModel], ...]:
    """Every family with a ComfyUI layout, with it (the support matrix's ComfyUI column)."""
    return tuple((f, f.comfy) for f in _REGISTRY.values() if f.comfy is not None)


def _supported_titles() -> str:
    return ", ".join(f.title for f in _REGISTRY.values() if f.refused is None)


ACCEPTED = (
    "a diffusers DiffusionPipeline or model of a supported family, a latent-diffusion object with .model.diffusion_model "
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
    pipeline = has_class_named(model, "DiffusionPipeline")
    if not roots:
        if pipeline:
            names = ", ".join(f"{k} ({type(v).__name__})" for k, v in (getattr(model, "components", {}) or {}).items() if v is not None)
            raise TypeError(
                f"{type(model).__name__} holds no model to patch (its components: {names or 'none'}); tokenmerge patches a "
                "pipeline's transformer or UNet (and its ControlNets)"
            )
        raise TypeError(f"tokenmerge cannot patch a {type(model).__name__}; expected {ACCEPTED}")
    layouts: list[DenoiserLayout] = []
    refused: list[str] = []
    claimed: set[int] = set()
    compiled: list[str] = []
    modules: list[torch.nn.Module] = []
    for root in roots:
        for name, module in root.named_modules():
            modules.append(module)
            # torch.compile(module) wraps it in an OptimizedModule; module.compile() compiles it in place
            if type(module).__name__ == "OptimizedModule" or getattr(module, "_compiled_call_impl", None) is not None:
                compiled.append(name or type(module).__name__)
            if id(module) in claimed:
                continue
            family = family_of(module)
            if family is None:
                continue
            if family.refused is not None:
                refused.append(f"{type(module).__name__} ({family.title}): {family.refused}")
                claimed.update(id(m) for m in module.modules())
                continue
            found = family.layout(module)
            if found is not None:
                layouts.append(found)
                claimed.update(id(m) for m in found.root.modules())
    if not layouts:
        if refused:
            raise TypeError(f"tokenmerge does not patch {'; '.join(refused)}")
        what = type(model).__name__
        if pipeline:
            components = getattr(model, "components", {}) or {}
            what = f"{what}'s " + ", ".join(f"{k} ({type(v).__name__})" for k, v in components.items() if isinstance(v, torch.nn.Module))
        raise TypeError(
            f"{what}: no supported model family. tokenmerge patches a model only where a family module describes how its "
            "blocks lay out their tokens (where the image, the text and the positions sit): a guessed layout could change "
            f"the output silently. Supported families: {_supported_titles()} (`tokenmerge support` lists their classes); "
            f"tokenmerge accepts {ACCEPTED}"
        )
    return Discovery(layouts, compiled, modules)
