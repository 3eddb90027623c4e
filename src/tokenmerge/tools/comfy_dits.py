"""ComfyUI's own diffusion transformers with random weights, sampled through ComfyUI's ``common_ksampler``: the
tests of the node's DiT path and ``tokenmerge bench --comfyui`` on transformers run them.

Needs a real ComfyUI checkout (:func:`tokenmerge.tools.comfy_models.import_comfy_checkout`, in a fresh process).
Each model is built from the ``unet_config`` ComfyUI's model detection would produce for a checkpoint, at a tiny
width (or the published one with ``full=True`` and the first blocks), through ``comfy.supported_models`` and
``comfy.model_base``, and its conditioning is the list ComfyUI's text encoders hand the sampler.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import torch

from .comfy_models import reinit_all
from .examples import ComfyExample, comfy_examples


def example(name: str) -> ComfyExample:
    """The ComfyUI example of the family ``name``."""
    found = comfy_examples()
    if name not in found:
        raise ValueError(f"no ComfyUI example of {name!r}; families with one: {', '.join(found)}")
    return found[name]


def _later_fields(example: ComfyExample) -> dict[str, Any]:
    """The fields newer ComfyUIs' model detection writes that the ComfyUI in use declares (0.33: all; 0.3.64: none)."""
    import dataclasses
    import importlib

    if example.later_fields is None:
        return {}
    module, cls, fields = example.later_fields
    declared = {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), cls))}
    return {k: v for k, v in fields.items() if k in declared}


def build(name: str, seed: int = 0, blocks: int | None = None, weight_dtype: torch.dtype | None = None) -> Any:
    """A ComfyUI ``ModelPatcher`` around the family ``name``'s model (:class:`ComfyExample`), seeded random weights
    (ComfyUI's layers come uninitialised; output layers included, so that a comparison cannot pass trivially): tiny,
    or (``blocks``) at its published width with its first ``blocks`` blocks (Flux.1: as many double- and twice as many
    single-stream); ``weight_dtype``: its weights stored so and cast at each layer, as ComfyUI's loaders'
    ``weight_dtype`` (fp8) does."""
    import comfy.model_patcher
    import comfy.supported_models

    found = example(name)
    unet_config = {**found.unet_config, **_later_fields(found)}
    if blocks is not None:
        if found.full is None:
            with_full = [n for n, e in comfy_examples().items() if e.full is not None]
            raise ValueError(f"--comfyui at full width: model must be one of {', '.join(with_full)}, got {name!r}")
        unet_config.update(found.full, **{key: blocks * per for key, per in found.blocks.items()})
    model_config = getattr(comfy.supported_models, found.supported)(unet_config)
    model_config.set_inference_dtype(weight_dtype or torch.float32, torch.float32 if weight_dtype is not None else None)
    model = model_config.get_model({}, device=torch.device("cpu"))
    reinit_all(model, seed)
    cpu = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)


def conditioning(name: str, seed: int = 1, tokens: int = 8, full: bool = False) -> tuple[list, list]:
    """(positive, negative) as ComfyUI's text encoders give them to the sampler (``full``: at the published width)."""
    found = example(name)
    context, pooled = (found.full_context, found.full_pooled) if full else (found.context, found.pooled)
    g = torch.Generator().manual_seed(seed)

    def one() -> list:
        extra: dict[str, Any] = {"guidance": 3.5}
        if pooled:
            extra["pooled_output"] = torch.randn(1, pooled, generator=g)
        if found.caption_mask:
            extra["attention_mask"] = torch.ones(1, tokens, dtype=torch.long)
        if found.llama3_layers:
            extra["conditioning_llama3"] = torch.randn(1, found.llama3_layers, tokens, context, generator=g)
        for key, length, width in found.extra_conditioning:
            extra[key] = torch.randn(1, length, width, generator=g)
        if found.clip_vision is not None:
            extra["clip_vision_output"] = SimpleNamespace(last_hidden_state=torch.randn(1, *found.clip_vision, generator=g))
        return [[torch.randn(1, tokens, context, generator=g), extra]]

    return one(), one()


def latent(name: str, height: int = 32, width: int = 32, frames: int = 3) -> dict[str, Any]:
    """An empty latent of ``height`` x ``width`` latent cells (``frames`` latent frames for video models); with the
    example's audio latent, both as ComfyUI's nested latent (video first), which its sampler packs into one."""
    found = example(name)
    shape = (1, found.channels, frames, height, width) if found.video else (1, found.channels, height, width)
    if found.audio is None:
        return {"samples": torch.zeros(shape)}
    import comfy.nested_tensor

    return {"samples": comfy.nested_tensor.NestedTensor([torch.zeros(shape), torch.zeros(1, *found.audio)])}


def sample(
    model: Any,
    name: str,
    steps: int = 2,
    seed: int = 0,
    tokens: int = 8,
    full: bool = False,
    noise: float | None = None,
    cfg: float = 2.0,
    **size: int,
) -> torch.Tensor:
    """ComfyUI's KSampler path (``nodes.common_ksampler``): euler, CFG 2 (one model call per step on a batch of
    two: conditional and unconditional; ``cfg=1``: the conditional alone), the given steps; ``noise``: one step
    instead, from the sigma at that noise level (1 = pure noise) to 0, through ``comfy.sample.sample``'s own sigmas.
    A nested latent (video and audio) comes back as one flat tensor of its streams."""
    import comfy.sample
    import nodes

    from .comfy_models import sigma_at_noise

    positive, negative = conditioning(name, tokens=tokens, full=full)
    empty = latent(name, **size)
    with torch.inference_mode():
        if noise is None:
            (found,) = nodes.common_ksampler(model, seed, steps, cfg, "euler", "simple", positive, negative, empty)
            out = found["samples"]
        else:
            x = comfy.sample.fix_empty_latent_channels(model, empty["samples"])
            sigmas = torch.tensor([sigma_at_noise(model.get_model_object("model_sampling"), noise), 0.0])
            start = comfy.sample.prepare_noise(x, seed)
            out = comfy.sample.sample(model, start, 1, cfg, "euler", "simple", positive, negative, x, sigmas=sigmas, seed=seed)
    return torch.cat([t.flatten() for t in out.unbind()]) if getattr(out, "is_nested", False) else out


class KeyCounter:
    """An ``optimized_attention_override`` that records each call's query and key lengths (as another node's
    override would sit under tokenmerge's, which chains it)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        q, k = args[0], args[1]
        seq = -2 if kwargs.get("skip_reshape", False) else 1
        self.calls.append((q.shape[seq], k.shape[seq]))
        return func(*args, **kwargs)

    def __deepcopy__(self, memo: dict) -> KeyCounter:
        return self


class FirstKeys:
    """An ``optimized_attention_override`` (under tokenmerge's, as :class:`KeyCounter`) that keeps the keys of the
    first call with at least ``tokens`` queries (the first self- or joint attention over the grid: queries are never
    reduced), the first sample's, as (S, C) rows."""

    def __init__(self, tokens: int) -> None:
        self.tokens, self.keys = tokens, None

    def __call__(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        q, k = args[0], args[1]
        seq = -2 if kwargs.get("skip_reshape", False) else 1
        if self.keys is None and q.shape[seq] >= self.tokens:
            rows = k[0].transpose(0, 1) if seq == -2 else k[0]  # (S, H, D) or (S, C)
            self.keys = rows.reshape(rows.shape[0], -1).clone()
        return func(*args, **kwargs)

    def __deepcopy__(self, memo: dict) -> FirstKeys:
        return self


def kept_rows(reduced: torch.Tensor, plain: torch.Tensor) -> list[int]:
    """The positions of ``plain``'s rows that ``reduced`` holds (exact copies: a nearest downsampling selects rows)."""
    index = {tuple(row.tolist()): i for i, row in enumerate(plain)}
    return sorted(index[tuple(row.tolist())] for row in reduced)


def grid_at(name: str, patch: tuple[int, ...], height: int = 32, width: int = 32, frames: int = 3) -> int:
    """Image tokens of :func:`latent`'s latent of ``name`` under a model's ``patch`` (ceil: ComfyUI pads)."""
    sides = (frames, height, width) if example(name).video else (height, width)
    return math.prod([-(-s // p) for s, p in zip(sides, patch[-len(sides) :])])


def relative_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / max(b.norm(), torch.tensor(1e-12)))


def expected_keys(text: int, grid: tuple[int, ...], factors: tuple[int, ...]) -> int:
    """Keys of a joint call after a nearest downsampling of its image segment by ``factors``."""
    return text + math.prod([math.ceil(s / f) for s, f in zip(grid, factors)])
