"""ComfyUI's own diffusion transformers with random weights, sampled through ComfyUI's ``common_ksampler``: the
tests of the node's DiT path and ``tokenmerge bench --comfyui`` on transformers run them.

Needs a real ComfyUI checkout (:func:`tokenmerge.tools.comfy_models.import_comfy_checkout`, in a fresh process).
Each model is built from the ``unet_config`` ComfyUI's model detection would produce for a checkpoint, at a tiny
width (or the published one with ``full=True`` and the first blocks), through ``comfy.supported_models`` and
``comfy.model_base``, and its conditioning is the list ComfyUI's text encoders hand the sampler.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .comfy_models import reinit_all

# name -> (supported_models class, unet_config (tiny), context dim, pooled dim or 0, latent channels, video)
TINY: dict[str, tuple[str, dict[str, Any], int, int, int, bool]] = {
    "flux": (
        "Flux",
        {
            "image_model": "flux",
            "in_channels": 16,
            "out_channels": 16,
            "patch_size": 2,
            "vec_in_dim": 32,
            "context_in_dim": 32,
            "hidden_size": 64,
            "mlp_ratio": 2.0,
            "num_heads": 4,
            "depth": 1,
            "depth_single_blocks": 2,
            "axes_dim": [4, 6, 6],
            "theta": 10000,
            "qkv_bias": True,
            "guidance_embed": True,
        },
        32,
        32,
        16,
        False,
    ),
    "flux2": (  # ComfyUI >= 0.4 (model detection's Flux.2 keys: 1x1 patches of a 128-channel latent)
        "Flux2",
        {
            "image_model": "flux2",
            "in_channels": 128,
            "out_channels": 128,
            "patch_size": 1,
            "vec_in_dim": None,
            "context_in_dim": 32,
            "hidden_size": 64,
            "mlp_ratio": 3.0,
            "num_heads": 4,
            "depth": 1,
            "depth_single_blocks": 2,
            "axes_dim": [4, 4, 4, 4],
            "theta": 2000,
            "qkv_bias": False,
            "guidance_embed": True,
            "txt_ids_dims": [3],
            "global_modulation": True,
            "mlp_silu_act": True,
            "ops_bias": False,
            "default_ref_method": "index",
            "ref_index_scale": 10.0,
        },
        32,
        0,
        128,
        False,
    ),
    "chroma": (
        "Chroma",
        {
            "image_model": "chroma",
            "in_channels": 64,
            "out_channels": 64,
            "context_in_dim": 32,
            "hidden_size": 64,
            "mlp_ratio": 2.0,
            "num_heads": 4,
            "depth": 1,
            "depth_single_blocks": 1,
            "axes_dim": [4, 6, 6],
            "theta": 10000,
            "patch_size": 2,
            "qkv_bias": True,
            "in_dim": 64,
            "out_dim": 64,
            "hidden_dim": 64,
            "n_layers": 1,
        },
        32,
        32,  # ComfyUI's Chroma conditioning carries a pooled output it does not use
        16,
        False,
    ),
    "hidream": (
        "HiDream",
        {
            "image_model": "hidream",
            "attention_head_dim": 32,
            "axes_dims_rope": [16, 8, 8],
            "caption_channels": [32, 32],
            "max_resolution": [64, 64],
            "in_channels": 16,
            "llama_layers": [0, 1],
            "num_attention_heads": 2,
            "num_routed_experts": 2,
            "num_activated_experts": 1,
            "num_layers": 1,
            "num_single_layers": 1,
            "out_channels": 16,
            "patch_size": 2,
            "text_emb_dim": 32,
        },
        32,
        32,
        16,
        False,
    ),
    "sd3": (
        "SD3",
        {
            "in_channels": 16,
            "out_channels": 16,
            "patch_size": 2,
            "depth": 2,
            "input_size": None,
            "adm_in_channels": 32,
            "context_embedder_config": {"target": "torch.nn.Linear", "params": {"in_features": 32, "out_features": 128}},
            "num_patches": 4096,
            "pos_embed_max_size": 64,
            "pos_embed_scaling_factor": None,
            "qk_norm": None,
            "x_block_self_attn_layers": [],
        },
        32,
        32,
        16,
        False,
    ),
    "qwen-image": (
        "QwenImage",
        {
            "image_model": "qwen_image",
            "in_channels": 64,
            "out_channels": 16,
            "num_layers": 2,
            "attention_head_dim": 16,
            "num_attention_heads": 2,
            "joint_attention_dim": 32,
            "axes_dims_rope": (4, 6, 6),
        },
        32,
        0,
        16,
        False,
    ),
    "wan": (
        "WAN21_T2V",
        {
            "image_model": "wan2.1",
            "model_type": "t2v",
            "dim": 64,
            "out_dim": 16,
            "num_heads": 2,
            "ffn_dim": 128,
            "num_layers": 2,
            "patch_size": (1, 2, 2),
            "freq_dim": 256,
            "window_size": (-1, -1),
            "qk_norm": True,
            "cross_attn_norm": True,
            "eps": 1e-6,
            "in_dim": 16,
            "text_dim": 32,
        },
        32,
        0,
        16,
        True,
    ),
    "hunyuanvideo": (
        "HunyuanVideo",
        {
            "image_model": "hunyuan_video",
            "in_channels": 16,
            "out_channels": 16,
            "vec_in_dim": 32,
            "context_in_dim": 32,
            "hidden_size": 64,
            "mlp_ratio": 2.0,
            "num_heads": 2,
            "depth": 1,
            "depth_single_blocks": 1,
            "axes_dim": [8, 12, 12],
            "theta": 256,
            "patch_size": [1, 2, 2],
            "qkv_bias": True,
            "guidance_embed": True,
            "byt5": False,
            "meanflow": False,
        },
        32,
        32,
        16,
        True,
    ),
    "ltxv": (
        "LTXV",
        {
            "image_model": "ltxv",
            "num_layers": 1,
            "attention_head_dim": 16,
            "num_attention_heads": 2,
            "cross_attention_dim": 32,
            "in_channels": 128,
            "caption_channels": 32,
        },
        32,
        0,
        128,
        True,
    ),
    "lumina2": (
        "Lumina2",
        {
            "image_model": "lumina2",
            "patch_size": 2,
            "in_channels": 16,
            "dim": 64,
            "cap_feat_dim": 32,
            "n_layers": 2,
            "n_heads": 2,
            "n_kv_heads": 2,
            "qk_norm": True,
            "axes_dims": [8, 12, 12],
            "axes_lens": [300, 512, 512],
        },
        32,
        0,
        16,
        False,
    ),
}


# Published widths (what ComfyUI's detection gives for the checkpoints; the diffusers bench's examples): name ->
# (the unet_config overrides, context dim, pooled dim, the config keys counting blocks and their proportion).
FULL: dict[str, tuple[dict[str, Any], int, int, dict[str, int]]] = {
    "flux": (
        {
            "vec_in_dim": 768,
            "context_in_dim": 4096,
            "hidden_size": 3072,
            "mlp_ratio": 4.0,
            "num_heads": 24,
            "axes_dim": [16, 56, 56],
        },
        4096,
        768,
        {"depth": 1, "depth_single_blocks": 2},
    ),
    "qwen-image": (
        {"attention_head_dim": 128, "num_attention_heads": 24, "joint_attention_dim": 3584, "axes_dims_rope": (16, 56, 56)},
        3584,
        0,
        {"num_layers": 1},
    ),
    "wan": ({"dim": 1536, "num_heads": 12, "ffn_dim": 8960, "text_dim": 4096}, 4096, 0, {"num_layers": 1}),  # Wan 2.1 1.3B
}


# Fields that newer ComfyUIs' model detection writes into these models' unet_config (with the value it gives such a
# checkpoint): name -> (the module and dataclass of the model's parameters, the fields). Added where that dataclass of
# the ComfyUI in use declares them (0.33: all of them; 0.3.64: none).
LATER_FIELDS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "flux": ("comfy.ldm.flux.model", "FluxParams", {"txt_ids_dims": []}),
    "chroma": ("comfy.ldm.chroma.model", "ChromaParams", {"txt_ids_dims": [], "vec_in_dim": None}),
    "hunyuanvideo": (
        "comfy.ldm.hunyuan_video.model",
        "HunyuanVideoParams",
        {"use_cond_type_embedding": False, "vision_in_dim": None, "meanflow_sum": False},
    ),
}


def _later_fields(name: str) -> dict[str, Any]:
    """The :data:`LATER_FIELDS` of ``name`` that the ComfyUI in use declares."""
    import dataclasses
    import importlib

    if name not in LATER_FIELDS:
        return {}
    module, cls, fields = LATER_FIELDS[name]
    declared = {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), cls))}
    return {k: v for k, v in fields.items() if k in declared}


def build(name: str, seed: int = 0, blocks: int | None = None) -> Any:
    """A ComfyUI ``ModelPatcher`` around the ``name`` model, seeded random weights (ComfyUI's layers come
    uninitialised; output layers included, so that a comparison cannot pass trivially): tiny, or (``blocks``) at
    its published width with its first ``blocks`` blocks (Flux.1: as many double- and twice as many single-stream)."""
    import comfy.model_patcher
    import comfy.supported_models

    class_name, unet_config, *_ = TINY[name]
    unet_config = {**unet_config, **_later_fields(name)}
    if blocks is not None:
        if name not in FULL:
            raise ValueError(f"--comfyui at full width: model must be one of {', '.join(FULL)}, got {name!r}")
        overrides, _, _, counts = FULL[name]
        unet_config.update(overrides, **{key: blocks * per for key, per in counts.items()})
    model_config = getattr(comfy.supported_models, class_name)(unet_config)
    model_config.set_inference_dtype(torch.float32, None)
    model = model_config.get_model({}, device=torch.device("cpu"))
    reinit_all(model, seed)
    cpu = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)


def conditioning(name: str, seed: int = 1, tokens: int = 8, full: bool = False) -> tuple[list, list]:
    """(positive, negative) as ComfyUI's text encoders give them to the sampler (``full``: at the published width)."""
    _, _, context, pooled, _, _ = TINY[name]
    if full:
        _, context, pooled, _ = FULL[name]
    g = torch.Generator().manual_seed(seed)

    def one() -> list:
        extra: dict[str, Any] = {"guidance": 3.5}
        if pooled:
            extra["pooled_output"] = torch.randn(1, pooled, generator=g)
        if name in ("ltxv", "lumina2"):  # their text encoders hand over the caption's mask too
            extra["attention_mask"] = torch.ones(1, tokens, dtype=torch.long)
        if name == "hidream":  # the Llama 3 hidden states of the layers the model reads, beside the T5 context
            extra["conditioning_llama3"] = torch.randn(1, 2, tokens, context, generator=g)
        return [[torch.randn(1, tokens, context, generator=g), extra]]

    return one(), one()


def latent(name: str, height: int = 32, width: int = 32, frames: int = 3) -> dict[str, torch.Tensor]:
    """An empty latent of ``height`` x ``width`` latent cells (``frames`` latent frames for video models)."""
    *_, channels, video = TINY[name]
    shape = (1, channels, frames, height, width) if video else (1, channels, height, width)
    return {"samples": torch.zeros(shape)}


def sample(
    model: Any, name: str, steps: int = 2, seed: int = 0, tokens: int = 8, full: bool = False, noise: float | None = None, **size: int
) -> torch.Tensor:
    """ComfyUI's KSampler path (``nodes.common_ksampler``): euler, CFG 2 (one model call per step on a batch of
    two: conditional and unconditional), the given steps; ``noise``: one step instead, from the sigma at that noise
    level (1 = pure noise) to 0, through ``comfy.sample.sample``'s own sigmas."""
    import comfy.sample
    import nodes

    from .comfy_models import sigma_at_noise

    positive, negative = conditioning(name, tokens=tokens, full=full)
    empty = latent(name, **size)
    with torch.inference_mode():
        if noise is None:
            (out,) = nodes.common_ksampler(model, seed, steps, 2.0, "euler", "simple", positive, negative, empty)
            return out["samples"]
        x = comfy.sample.fix_empty_latent_channels(model, empty["samples"])
        sigmas = torch.tensor([sigma_at_noise(model.get_model_object("model_sampling"), noise), 0.0])
        start = comfy.sample.prepare_noise(x, seed)
        return comfy.sample.sample(model, start, 1, 2.0, "euler", "simple", positive, negative, x, sigmas=sigmas, seed=seed)


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


def grid_at(name: str, patch: tuple[int, ...], height: int = 32, width: int = 32, frames: int = 3) -> int:
    """Image tokens of :func:`latent`'s latent of ``name`` under a model's ``patch`` (ceil: ComfyUI pads)."""
    sides = (frames, height, width) if TINY[name][5] else (height, width)
    return math.prod([-(-s // p) for s, p in zip(sides, patch[-len(sides) :])])


def relative_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / max(b.norm(), torch.tensor(1e-12)))


def expected_keys(text: int, grid: tuple[int, ...], factors: tuple[int, ...]) -> int:
    """Keys of a joint call after a nearest downsampling of its image segment by ``factors``."""
    return text + math.prod([math.ceil(s / f) for s, f in zip(grid, factors)])
