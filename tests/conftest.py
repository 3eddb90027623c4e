"""Shared builders: real model classes (diffusers, ldm) with random weights, small unless marked slow."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import pytest
import torch

from tokenmerge.architectures import build_unet, unet_inputs

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


@pytest.fixture(scope="session")
def sd15_small() -> torch.nn.Module:
    return build_unet("sd15", small=True)


@pytest.fixture(scope="session")
def sdxl_small() -> torch.nn.Module:
    return build_unet("sdxl", small=True)


@pytest.fixture(scope="session")
def ldm_small() -> torch.nn.Module:
    return build_ldm_unet(small=True)


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


def max_rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| relative to the output scale (max |b|)."""
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


# ---- ComfyUI (the `comfy` package from notcomfy: GPL-3, a test-only dependency) ----

COMFY_SD15_SMALL = {
    "use_checkpoint": False,
    "image_size": 32,
    "in_channels": 4,
    "out_channels": 4,
    "model_channels": 32,
    "num_res_blocks": [1, 1, 1, 1],
    "channel_mult": [1, 2, 2, 2],
    "transformer_depth": [1, 1, 1, 0],
    "transformer_depth_middle": 1,
    "transformer_depth_output": [1, 1, 1, 1, 1, 1, 0, 0],
    "context_dim": 32,
    "num_heads": 2,
    "use_linear_in_transformer": False,
    "use_spatial_transformer": True,
    "legacy": False,
    "adm_in_channels": None,
    "use_temporal_resblock": False,
    "use_temporal_attention": False,
}
# SDXL's shape: no attention at the top level, deeper transformers below, linear projections, ADM input.
COMFY_SDXL_SMALL = {
    **COMFY_SD15_SMALL,
    "num_res_blocks": [1, 1, 1],
    "channel_mult": [1, 2, 2],
    "transformer_depth": [0, 1, 2],
    "transformer_depth_middle": 2,
    "transformer_depth_output": [0, 0, 1, 1, 2, 2],
    "use_linear_in_transformer": True,
    "adm_in_channels": 64,
    "num_classes": "sequential",
    "num_heads": -1,
    "num_head_channels": 16,
}


def import_comfy():
    """Import ComfyUI's package the way it must be: argument parsing on, CPU only."""
    import sys

    saved = sys.argv
    sys.argv = ["comfyui", "--cpu"]
    try:
        import comfy.options

        comfy.options.enable_args_parsing()
        import comfy.model_management  # noqa: F401  (parses the arguments)
        import comfy.model_patcher
        import comfy.supported_models
    finally:
        sys.argv = saved
    return comfy


def reinit_all(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """ComfyUI builds layers without initialising them: give every parameter a seeded value."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            for name, p in m.named_parameters(recurse=False):
                if p.dim() > 1:
                    bound = 1 / math.sqrt(p[0].numel())
                    p.copy_(torch.empty(p.shape).uniform_(-bound, bound, generator=g))
                else:
                    p.fill_(1.0 if name == "weight" else 0.0)
    return module


def build_comfy_patcher(config: dict, sdxl: bool = False, seed: int = 0):
    comfy = import_comfy()
    model_config = (comfy.supported_models.SDXL if sdxl else comfy.supported_models.SD15)(dict(config))
    model = model_config.get_model({}, device=torch.device("cpu"))
    reinit_all(model, seed)
    return comfy.model_patcher.ModelPatcher(model, load_device=torch.device("cpu"), offload_device=torch.device("cpu"))


def comfy_run(patcher, x: torch.Tensor, sigma: float = 2.0, context: torch.Tensor | None = None, **extra) -> torch.Tensor:
    """One denoiser call as ComfyUI's sampler makes it: the patcher's transformer_options plus sigmas."""
    options = dict(patcher.model_options.get("transformer_options", {}))
    sigmas = torch.full((x.shape[0],), sigma)
    options.update(sigmas=sigmas, cond_or_uncond=[0] * x.shape[0])
    with torch.no_grad():
        return patcher.model.apply_model(x, sigmas, c_crossattn=context, transformer_options=options, **extra)
