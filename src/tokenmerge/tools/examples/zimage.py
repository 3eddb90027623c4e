"""The examples of the z-image family (tokenmerge.families.zimage): its published configs, tiny configs and a pipeline's call, for tests and benchmarks."""

from __future__ import annotations

from typing import Any

import torch

from . import ComfyExample, Example


def inputs(
    model: torch.nn.Module,
    height: int,
    width: int,
    batch: int,
    seed: int,
    text_tokens: int,
    lengths: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """The Z-Image pipeline's call at a (height, width) latent: ``x`` and ``cap_feats`` as per-sample lists
    (``lengths``: each sample's caption length, ``text_tokens`` for all by default). ``t`` is one value (shape
    (1,)) that broadcasts over the batch: the pipeline passes B equal values; one keeps every tensor input's shape
    independent of the batch (the per-sample lists carry it)."""
    config, g, dtype = model.config, torch.Generator().manual_seed(seed), model.dtype
    lengths = tuple(lengths) if lengths is not None else (text_tokens,) * batch
    latents = torch.randn(batch, config.in_channels, height, width, generator=g).to(dtype)
    return {
        "x": list(latents.unsqueeze(2).unbind(0)),
        "t": torch.full((1,), 0.5),
        "cap_feats": [torch.randn(n, config.cap_feat_dim, generator=g).to(dtype) for n in lengths],
        "return_dict": False,
    }


def output(out: Any) -> torch.Tensor:
    """The (B, C, H, W) latent of the model's per-sample list of (C, 1, H, W), as the pipeline stacks it."""
    samples = out.sample if hasattr(out, "sample") else out[0]
    return torch.stack(list(samples)).squeeze(2)


def first_blocks(config: dict[str, Any], n: int) -> dict[str, Any]:
    """The first ``n`` main layers (the two refiners of each kind stay: they run before the main layers)."""
    return {**config, "n_layers": min(n, config["n_layers"])}


# transformer/config.json of Tongyi-MAI/Z-Image-Turbo.
CONFIG = {
    "all_patch_size": (2,),
    "all_f_patch_size": (1,),
    "in_channels": 16,
    "dim": 3840,
    "n_layers": 30,
    "n_refiner_layers": 2,
    "n_heads": 30,
    "n_kv_heads": 30,
    "norm_eps": 1e-5,
    "qk_norm": True,
    "cap_feat_dim": 2560,
    "rope_theta": 256.0,
    "t_scale": 1000.0,
    "axes_dims": [32, 48, 48],
    "axes_lens": [1536, 512, 512],
}


SMALL = {
    "in_channels": 4,
    "dim": 32,
    "n_layers": 2,
    "n_refiner_layers": 1,
    "n_heads": 2,
    "n_kv_heads": 2,
    "cap_feat_dim": 16,
    "axes_dims": [8, 4, 4],  # sum = head_dim (asserted by the model)
    "axes_lens": [512, 64, 64],  # axis 0 > padded caption + 1; axes 1, 2 >= the token grid
}


FAMILY = "z-image"
EXAMPLES = {"z-image": Example("ZImageTransformer2DModel", CONFIG, SMALL, inputs, 512, first_blocks, output)}

# ComfyUI 0.33's Z-Image: Lumina 2's NextDiT class and image_model, with Z-Image's modulation, and the caption and the
# image each padded at their end to a multiple of 32 tokens ([caption + pad; image + pad]; model_detection's fields)
COMFY = ComfyExample(
    supported="ZImage",
    unet_config={
        "image_model": "lumina2",
        "patch_size": 2,
        "in_channels": 16,
        "dim": 256,  # the smallest width Z-Image's modulation allows (its timestep embedding is 256 wide)
        "cap_feat_dim": 32,
        "n_layers": 2,
        "n_heads": 8,
        "n_kv_heads": 8,
        "qk_norm": True,
        "axes_dims": [8, 12, 12],
        "axes_lens": [1536, 512, 512],
        "rope_theta": 256.0,
        "ffn_dim_multiplier": 8.0 / 3.0,
        "z_image_modulation": True,
        "time_scale": 1000.0,
        "pad_tokens_multiple": 32,
    },
    context=32,
    pooled=0,
    channels=16,
    video=False,
    caption_mask=True,
    since="0.33.0",
    # model detection's Z-Image (dim 3840): 30 heads, Qwen3-4B's 2560-wide caption; the bench keeps its first layers
    full={"dim": 3840, "cap_feat_dim": 2560, "n_heads": 30, "n_kv_heads": 30, "axes_dims": [32, 48, 48]},
    full_context=2560,
    blocks={"n_layers": 1},
)
