"""A stand-in for Forge (lllyasviel/stable-diffusion-webui-forge, not on PyPI), mirroring what tokenmerge meets.

Checked against Forge's source at commit dfdcbab (2025-06-26):

- ``backend/patcher/base.py`` ``ModelPatcher``: ``clone()`` deep-copies ``model_options``;
  ``set_model_patch(patch, name)`` appends to ``model_options["transformer_options"]["patches"][name]``;
  ``set_model_attn1_patch`` / ``set_model_attn2_patch`` / ``set_model_attn1_output_patch`` /
  ``set_model_attn2_output_patch`` call it with those names. ``backend/patcher/unet.py`` ``UnetPatcher`` adds
  fields and returns a ``UnetPatcher`` from ``clone()``.
- ``backend/nn/unet.py``: its ``BasicTransformerBlock._forward`` ("Stolen from ComfyUI") calls
  ``attn1_patch(n, context_attn1, value_attn1, extra_options)`` with ``n = norm1(x)``, then
  ``attn1_output_patch(n, extra_options)``, and the attn2 pair, with ``extra_options`` holding
  ``original_shape``, ``block``, ``block_index``, ``sigmas``, ... — the same forms as ComfyUI's, so the model
  behind the patcher here is ComfyUI's UNet (``notcomfy``).
- ``backend/misc/tomesd.py`` ``TomePatcher().patch(model, ratio)`` clones the patcher and registers an attn1
  patch; ``modules/sd_models.apply_token_merging`` calls it on ``sd_model.forge_objects.unet`` before each pass.
"""

from __future__ import annotations

import copy
import sys
import types

import torch


class ModelPatcher:
    def __init__(self, model, load_device, offload_device, size=0, current_device=None, **kwargs):
        self.size = size
        self.model = model
        self.lora_patches = {}
        self.object_patches = {}
        self.object_patches_backup = {}
        self.model_options = {"transformer_options": {}}
        self.load_device, self.offload_device, self.current_device = load_device, offload_device, current_device

    def clone(self):
        n = ModelPatcher(self.model, self.load_device, self.offload_device, self.size, self.current_device)
        n.lora_patches = self.lora_patches.copy()
        n.object_patches = self.object_patches.copy()
        n.model_options = copy.deepcopy(self.model_options)
        return n

    def set_model_patch(self, patch, name):
        to = self.model_options["transformer_options"]
        if "patches" not in to:
            to["patches"] = {}
        to["patches"][name] = to["patches"].get(name, []) + [patch]

    def set_model_attn1_patch(self, patch):
        self.set_model_patch(patch, "attn1_patch")

    def set_model_attn2_patch(self, patch):
        self.set_model_patch(patch, "attn2_patch")

    def set_model_attn1_output_patch(self, patch):
        self.set_model_patch(patch, "attn1_output_patch")

    def set_model_attn2_output_patch(self, patch):
        self.set_model_patch(patch, "attn2_output_patch")


class UnetPatcher(ModelPatcher):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.controlnet_linked_list = None
        self.extra_preserved_memory_during_sampling = 0
        self.extra_model_patchers_during_sampling = []
        self.extra_concat_condition = None

    def clone(self):
        n = UnetPatcher(self.model, self.load_device, self.offload_device, self.size, self.current_device)
        n.lora_patches = self.lora_patches.copy()
        n.object_patches = self.object_patches.copy()
        n.model_options = copy.deepcopy(self.model_options)
        n.controlnet_linked_list = self.controlnet_linked_list
        n.extra_preserved_memory_during_sampling = self.extra_preserved_memory_during_sampling
        n.extra_model_patchers_during_sampling = self.extra_model_patchers_during_sampling.copy()
        n.extra_concat_condition = self.extra_concat_condition
        return n


class TomePatcher:
    """Forge's built-in: merges the self-attention queries only (keys and values stay full length)."""

    def patch(self, model, ratio):
        m = model.clone()
        m.set_model_attn1_patch(lambda q, k, v, extra_options: (q, k, v))
        m.built_in_tome_ratio = ratio
        return m


class ForgeObjects:
    def __init__(self, unet):
        self.unet = unet

    def shallow_copy(self):
        return ForgeObjects(self.unet)


def apply_token_merging(sd_model, token_merging_ratio):
    """Forge's modules/sd_models.apply_token_merging, verbatim apart from the print."""
    if token_merging_ratio <= 0:
        return
    from backend.misc.tomesd import TomePatcher

    sd_model.forge_objects.unet = TomePatcher().patch(model=sd_model.forge_objects.unet, ratio=token_merging_ratio)


def install_modules(monkeypatch) -> types.ModuleType:
    """Put ``backend.misc.tomesd`` (with Forge's TomePatcher) into sys.modules; returns that module."""
    backend, misc, tomesd = (types.ModuleType(n) for n in ("backend", "backend.misc", "backend.misc.tomesd"))
    tomesd.TomePatcher = TomePatcher
    backend.misc, misc.tomesd = misc, tomesd
    for name, module in {"backend": backend, "backend.misc": misc, "backend.misc.tomesd": tomesd}.items():
        monkeypatch.setitem(sys.modules, name, module)
    return tomesd


def sd_model_for(comfy_patcher) -> types.SimpleNamespace:
    """Forge's sd_model with forge_objects around ComfyUI's UNet (the same patch call forms as Forge's UNet)."""
    unet = UnetPatcher(comfy_patcher.model, torch.device("cpu"), torch.device("cpu"))
    objects = ForgeObjects(unet)
    return types.SimpleNamespace(forge_objects=objects, forge_objects_after_applying_lora=objects.shallow_copy())


def sample(unet_patcher, x, context, sigma=2.0):
    """One denoiser call as Forge's sampling_function makes it (transformer_options copied, sigmas added)."""
    options = dict(unet_patcher.model_options.get("transformer_options", {}))
    sigmas = torch.full((x.shape[0],), sigma)
    options.update(sigmas=sigmas, cond_or_uncond=[0] * x.shape[0])
    with torch.inference_mode():
        return unet_patcher.model.apply_model(x, sigmas, c_crossattn=context, transformer_options=options)
