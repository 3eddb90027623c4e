"""Shared builders: real model classes (diffusers, ldm) with random weights, small unless marked slow."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import pytest
import torch
from torch.overrides import TorchFunctionMode

import tokenmerge
from tokenmerge.tools.architectures import build_model, build_unet, unet_inputs

torch.set_num_threads(max(1, torch.get_num_threads()))

# SD 1.5's ldm UNetModel parameters (v1-inference.yaml), and a narrow variant with the same structure.
LDM_SD15 = dict(
    image_size=32,
    in_channels=4,
    out_channels=4,
    model_channels=320,
    attention_resolutions=[4, 2, 1],
    num_res_blocks=2,
    channel_mult=[1, 2, 4, 4],
    num_heads=8,
    use_spatial_transformer=True,
    transformer_depth=1,
    context_dim=768,
    use_checkpoint=True,
    legacy=False,
)
LDM_SMALL = {**LDM_SD15, "model_channels": 32, "num_res_blocks": 1, "num_heads": 2, "context_dim": 32}


def reinit_zeroed(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """ldm zero-initialises output layers; give them random weights or every comparison passes trivially."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() > 1 and not p.any():
                fan_in = p[0].numel()
                p.uniform_(-1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in), generator=g)
    return module


def build_ldm_unet(small: bool = True, seed: int = 0) -> torch.nn.Module:
    from ldm.modules.diffusionmodules.openaimodel import UNetModel

    torch.manual_seed(seed)
    return reinit_zeroed(UNetModel(**(LDM_SMALL if small else LDM_SD15)), seed).eval()


def ldm_inputs(h: int, w: int, batch: int = 2, seed: int = 0, context_dim: int = 32) -> tuple[torch.Tensor, ...]:
    """Positional inputs of an ldm ``UNetModel``: (x, timesteps, context)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 4, h, w, generator=g)
    return x, torch.full((batch,), 500.0), torch.randn(batch, 77, context_dim, generator=g)


SHARED_MODELS: list[torch.nn.Module] = []


def shared(model: torch.nn.Module) -> torch.nn.Module:
    """Register a model that several tests use: every test must leave it unpatched (checked after each test)."""
    SHARED_MODELS.append(model)
    return model


@pytest.fixture(autouse=True)
def _shared_models_are_left_unpatched():
    yield
    dirty = [
        type(m).__name__
        for m in SHARED_MODELS
        if tokenmerge.get_config(m) is not None or any(type(x).__name__ == "ToMeBlock" for x in m.modules())
    ]
    for model in SHARED_MODELS:
        tokenmerge.remove_patch(model)  # so that one failure does not cascade into the tests after it
    assert not dirty, f"the test left shared models patched: {dirty}"


@pytest.fixture(scope="session")
def sd15_small() -> torch.nn.Module:
    return shared(build_unet("sd15", small=True))


@pytest.fixture(scope="session")
def sdxl_small() -> torch.nn.Module:
    return shared(build_unet("sdxl", small=True))


@pytest.fixture(scope="session")
def ldm_small() -> torch.nn.Module:
    return shared(build_ldm_unet(small=True))


def sd_inputs(unet: torch.nn.Module, h: int = 16, w: int = 16, batch: int = 2, seed: int = 0) -> dict:
    return unet_inputs(unet, h, w, batch=batch, seed=seed, text_tokens=7)


@contextlib.contextmanager
def attn1_token_counts(model: torch.nn.Module) -> Iterator[list[int]]:
    """Record how many tokens every self-attention (attn1) receives while the context is open."""
    counts: list[int] = []
    handles = [
        m.attn1.register_forward_pre_hook(lambda mod, args, kwargs: counts.append(args[0].shape[1]), with_kwargs=True)
        for m in model.modules()
        if type(m).__name__ == "BasicTransformerBlock"
    ]
    try:
        yield counts
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def key_value_counts(model):
    """(query tokens, key/value tokens) of every self-attention call, read at its to_q / to_k layers."""
    seen: list[tuple[int, int]] = []
    queries: list[int] = []
    handles = []
    for m in model.modules():
        if type(m).__name__ == "BasicTransformerBlock":
            handles.append(m.attn1.to_q.register_forward_hook(lambda mod, args, out: queries.append(args[0].shape[1])))
            handles.append(m.attn1.to_k.register_forward_hook(lambda mod, args, out: seen.append((queries[-1], args[0].shape[1]))))
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


class AttentionCalls(TorchFunctionMode):
    """(query, key, mask) of every scaled_dot_product_attention call, (B, H, S, D), copied as they were."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            named = dict(zip(("query", "key", "value", "attn_mask"), args)) | kwargs
            mask = named.get("attn_mask")
            self.calls.append((named["query"].detach().clone(), named["key"].detach().clone(), None if mask is None else mask.clone()))
        return func(*args, **kwargs)


def max_rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| relative to the output scale (max |b|)."""
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


@pytest.fixture
def recorded_plans(monkeypatch) -> list:
    """Every merge plan the hooks compute while the test runs, in order."""
    import tokenmerge.methods.tome

    plans: list = []
    real = tokenmerge.methods.tome.plan_merge

    def recording(*args, **kwargs):
        plan = real(*args, **kwargs)
        if plan is not None:
            plans.append(plan)
        return plan

    monkeypatch.setattr(tokenmerge.methods.tome, "plan_merge", recording)
    return plans


def pytest_report_header(config) -> str:
    """Which ComfyUI code the ComfyUI tests run against (a checkout from COMFYUI_PATH, or notcomfy)."""
    import importlib.util

    if importlib.util.find_spec("comfy") is None:
        return "ComfyUI: not installed (its tests are skipped)"
    from importlib.metadata import PackageNotFoundError, version

    try:
        notcomfy = f"notcomfy {version('notcomfy')}"
    except PackageNotFoundError:
        notcomfy = "no notcomfy"
    import os

    return f"ComfyUI: COMFYUI_PATH={os.environ.get('COMFYUI_PATH', '(unset)')}, {notcomfy}"


def sample_of(value, single, i: int):
    """Sample ``i`` of a batched input, along the axis where the batch sits (found against the same input at batch 1:
    HiDream's Llama states are (layers, B, tokens, C)); a per-sample list (Z-Image's latents) by its element."""
    if isinstance(value, list) and isinstance(single, list) and len(value) != len(single):
        return value[i : i + 1]
    if not isinstance(value, torch.Tensor):
        return value
    dims = [d for d, (a, b) in enumerate(zip(value.shape, single.shape)) if a != b]
    return value.narrow(dims[0], i, 1) if dims else value


HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs")
_MODELS: dict[str, torch.nn.Module] = {}


def model_of(name: str) -> torch.nn.Module:
    """The small random-weight model of an example, built once per test process."""
    if name not in _MODELS:
        _MODELS[name] = build_model(name, small=True)
    return _MODELS[name]


def hook_count(model: torch.nn.Module) -> int:
    return sum(len(getattr(m, d)) for m in model.modules() for d in HOOK_DICTS)
