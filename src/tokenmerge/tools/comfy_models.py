"""ComfyUI's own SD 1.5 / SDXL UNets with random weights, for ``tokenmerge bench --comfyui`` and the tests.

Needs ComfyUI's ``comfy`` package: a ComfyUI checkout named by the ``COMFYUI_PATH`` environment variable, or
PyPI's ``notcomfy`` (an older copy of it, GPL-3; never vendored, imported only here, at run time). notcomfy
installs a regular ``comfy`` package, and a regular package wins over a checkout's namespace package whatever
the order of ``sys.path``: with ``COMFYUI_PATH`` set, an import that does not come from the checkout raises
instead of silently testing notcomfy. ComfyUI must parse its arguments (``--cpu`` here) before its model
code is imported.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

import torch

_SD15: dict[str, Any] = {
    "use_checkpoint": False,
    "image_size": 32,
    "in_channels": 4,
    "out_channels": 4,
    "model_channels": 320,
    "num_res_blocks": [2, 2, 2, 2],
    "channel_mult": [1, 2, 4, 4],
    "transformer_depth": [1, 1, 1, 1, 1, 1, 0, 0],
    "transformer_depth_middle": 1,
    "transformer_depth_output": [1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0],
    "context_dim": 768,
    "num_heads": 8,
    "use_linear_in_transformer": False,
    "use_spatial_transformer": True,
    "legacy": False,
    "adm_in_channels": None,
    "use_temporal_resblock": False,
    "use_temporal_attention": False,
}
_SD15_SMALL = {
    **_SD15,
    "model_channels": 32,
    "num_res_blocks": [1, 1, 1, 1],
    "channel_mult": [1, 2, 2, 2],
    "transformer_depth": [1, 1, 1, 0],
    "transformer_depth_output": [1, 1, 1, 1, 1, 1, 0, 0],
    "context_dim": 32,
    "num_heads": 2,
}
# SDXL's shape: no attention at the top level, deeper transformers below, linear projections, ADM input.
_SDXL_SMALL = {
    **_SD15_SMALL,
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
CONFIGS = {"sd15": _SD15, "sd15-small": _SD15_SMALL, "sdxl-small": _SDXL_SMALL}


ATTENTION_FLAGS = {"default": [], "pytorch": ["--use-pytorch-cross-attention"], "sub-quadratic": ["--use-quad-cross-attention"]}


def import_comfy(attention: str | None = None) -> Any:
    """Import ComfyUI's package with its argument parsing on, ``--cpu``, and the attention backend's flag.

    ComfyUI picks its attention function once, at import: ``None`` takes the backend already chosen (``default``
    on first import); a second call naming another backend raises."""
    if attention is not None and attention not in ATTENTION_FLAGS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION_FLAGS)}, got {attention!r}")
    if "comfy.model_management" in sys.modules:
        chosen = getattr(import_comfy, "attention", "default")
        if attention not in (None, chosen):
            raise RuntimeError(f"ComfyUI was already imported with attention={chosen!r}; its backend is chosen once per process")
        import comfy

        return comfy
    attention = attention or "default"
    import_comfy.attention = attention  # type: ignore[attr-defined]
    checkout = os.environ.get("COMFYUI_PATH")
    if checkout and checkout not in sys.path:
        sys.path.insert(0, checkout)
    saved = sys.argv
    sys.argv = ["comfyui", "--cpu", *ATTENTION_FLAGS[attention]]
    try:
        import comfy.options

        comfy.options.enable_args_parsing()
        import comfy.model_management
        import comfy.model_patcher
        import comfy.supported_models
    finally:
        sys.argv = saved
    source = comfy_source()
    if checkout and not source.startswith(os.path.realpath(checkout)):
        raise RuntimeError(
            f"COMFYUI_PATH={checkout} but 'comfy' was imported from {source}: notcomfy's regular package shadows the "
            "checkout's namespace package whatever the order of sys.path; pip uninstall notcomfy to use the checkout"
        )
    return comfy


class _AbsentCompiledPackage:
    """Import hook for the test set-up of a ComfyUI checkout: empty ``torchvision`` / ``torchaudio`` packages.

    ComfyUI's ``comfy.model_base`` imports every model module, and some import torchvision at module level (Cosmos's
    ``torchvision.transforms``; 0.33's SAM 3 detector ``torchvision.ops.roi_align``); 0.33's ``nodes`` imports
    torchaudio (through ``comfy.sd``, for LTX-2's audio VAE). Each is used only when such a model runs. PyPI's
    torchvision wheel for this torch is a CUDA build whose compiled ops do not load with the CPU torch, and no
    torchaudio wheel matches it, so the tests stand empty modules in for them, whose names are stand-ins that raise
    when used; no model tokenmerge patches touches either. Only for those that are not importable."""

    def __init__(self, packages: tuple[str, ...]) -> None:
        self.packages = packages

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        import importlib.machinery

        if name.split(".")[0] not in self.packages:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: Any) -> Any:
        import types

        module = types.ModuleType(spec.name)
        module.__path__ = []

        def absent(attribute: str) -> Any:
            if attribute.startswith("__"):
                raise AttributeError(attribute)

            def unavailable(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError(f"{spec.name}.{attribute} is a stand-in: torchvision is not installed in this test set-up")

            return unavailable

        module.__getattr__ = absent  # type: ignore[method-assign]
        return module

    def exec_module(self, module: Any) -> None:
        return None


def import_comfy_checkout(checkout: str, attention: str | None = None) -> Any:
    """Import the ComfyUI checkout at ``checkout`` (with ``--cpu``) even where notcomfy is installed: the checkout's
    namespace packages (``comfy``, ``comfy_execution``, ``comfy_api``, ...) are bound to its folders before anything
    imports them (notcomfy's regular packages of those names would otherwise shadow them). For a fresh process (tests run it in a subprocess); raises if ``comfy`` came from elsewhere."""
    import importlib.util
    import types

    checkout = os.path.realpath(checkout)
    if "comfy" in sys.modules and comfy_source() != checkout:
        raise RuntimeError(f"'comfy' is already imported from {comfy_source()}; import the checkout {checkout} in a fresh process")
    if checkout not in sys.path:
        sys.path.insert(0, checkout)
    for name in sorted(os.listdir(checkout)):  # notcomfy installs regular packages under the checkout's namespace names
        folder = os.path.join(checkout, name)
        if name not in sys.modules and os.path.isdir(folder) and not os.path.exists(os.path.join(folder, "__init__.py")):
            package = types.ModuleType(name)
            package.__path__ = [folder]
            sys.modules[name] = package
    absent = tuple(name for name in ("torchvision", "torchaudio") if importlib.util.find_spec(name) is None)
    if absent:
        sys.meta_path.insert(0, _AbsentCompiledPackage(absent))
    os.environ["COMFYUI_PATH"] = checkout
    return import_comfy(attention)


def comfy_source() -> str:
    """Where the imported ``comfy`` package comes from (a checkout's folder, or notcomfy's in site-packages)."""
    import comfy

    locations = list(getattr(comfy, "__path__", [])) or [os.path.dirname(comfy.__file__)]
    return os.path.realpath(os.path.dirname(locations[0]))


def attention_backend() -> str:
    """The name of the attention function ComfyUI's UNet uses in this process."""
    import comfy.ldm.modules.attention as attention

    return attention.optimized_attention.__name__


# Buffers ComfyUI allocates with torch.empty and fills only from a checkpoint.
CHECKPOINT_BUFFERS = frozenset({"pos_embed"})


def reinit_all(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """ComfyUI builds layers without initialising them: give every parameter a seeded value, and the buffers it
    leaves as ``torch.empty`` for a checkpoint to fill (MMDiT's ``pos_embed``) too: uninitialised memory differs
    between machines and runs, and can hold NaNs. A norm's scale of 0 would zero its queries and keys (attention
    uniform: a test of where keys sit could not tell them apart)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            for name, p in m.named_parameters(recurse=False):
                if p.dim() > 1:
                    bound = 1 / math.sqrt(p[0].numel())
                    p.copy_(torch.empty(p.shape).uniform_(-bound, bound, generator=g))
                else:  # norms' multiplicative weights and scales (Flux's RMSNorm "scale") 1, biases and shifts 0
                    p.fill_(1.0 if name in ("weight", "scale") else 0.0)
            for name, b in m.named_buffers(recurse=False):
                if name in CHECKPOINT_BUFFERS:
                    b.copy_(torch.empty(b.shape).uniform_(-1.0, 1.0, generator=g))
    return module


def build_comfy_patcher(name: str = "sd15", seed: int = 0) -> Any:
    """A ComfyUI ``ModelPatcher`` around ComfyUI's UNet for ``name`` (see ``CONFIGS``), random weights."""
    comfy = import_comfy()
    config = CONFIGS[name]
    model_class = comfy.supported_models.SDXL if name.startswith("sdxl") else comfy.supported_models.SD15
    model = model_class(dict(config)).get_model({}, device=torch.device("cpu"))
    reinit_all(model, seed)
    cpu = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)


def sigma_at_noise(model_sampling: Any, level: float) -> float:
    """The sigma of ``model_sampling`` whose noise level (:func:`tokenmerge.integrations.comfyui.comfy_noise`: its
    timestep as a fraction of the noisiest one) is ``level``, by bisection (ComfyUI's ``sigma(timestep)`` is no
    inverse of ``timestep(sigma)`` on flow models, whose ``sigma`` applies the shift)."""
    from ..integrations.comfyui import comfy_noise

    low, high = float(model_sampling.sigma_min), float(model_sampling.sigma_max)
    for _ in range(60):
        mid = (low + high) / 2
        if comfy_noise(model_sampling, torch.tensor([mid])) < level:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def comfy_run(patcher: Any, x: torch.Tensor, sigma: float = 2.0, context: torch.Tensor | None = None, **extra: Any) -> torch.Tensor:
    """One denoiser call as ComfyUI's sampler makes it: the patcher's transformer_options plus sigmas."""
    options = dict(patcher.model_options.get("transformer_options", {}))
    sigmas = torch.full((x.shape[0],), sigma)
    options.update(sigmas=sigmas, cond_or_uncond=[0] * x.shape[0])
    with torch.inference_mode():
        return patcher.model.apply_model(x, sigmas, c_crossattn=context, transformer_options=options, **extra)
