"""The architectures of SD 1.5, SD 2.1, SDXL (UNets), SD3-medium, SD3.5-medium, Flux.1-dev and PixArt-Σ
(transformers), built from the configs of the published checkpoints with random weights.

Nothing is downloaded: benchmarks and tests build the real diffusers classes (``small=True`` shrinks widths
and depths, keeping the block structure, for fast tests; ``blocks`` keeps a transformer's full width but only
its first blocks, where the whole model does not fit in memory or time: every block of a transformer is the
same computation, so the per-block speed-up carries over). Used by the CLI and tests only.
"""

from __future__ import annotations

from typing import Any

import torch

_SD15: dict[str, Any] = {
    "sample_size": 64,
    "in_channels": 4,
    "out_channels": 4,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    "block_out_channels": [320, 640, 1280, 1280],
    "layers_per_block": 2,
    "attention_head_dim": 8,
    "cross_attention_dim": 768,
}
_SD21: dict[str, Any] = {
    **_SD15,
    "sample_size": 96,
    "attention_head_dim": [5, 10, 20, 20],
    "cross_attention_dim": 1024,
    "use_linear_projection": True,
    "upcast_attention": True,
}
_SDXL: dict[str, Any] = {
    "sample_size": 128,
    "in_channels": 4,
    "out_channels": 4,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "block_out_channels": [320, 640, 1280],
    "layers_per_block": 2,
    "transformer_layers_per_block": [1, 2, 10],
    "attention_head_dim": [5, 10, 20],
    "cross_attention_dim": 2048,
    "use_linear_projection": True,
    "addition_embed_type": "text_time",
    "addition_time_embed_dim": 256,
    "projection_class_embeddings_input_dim": 2816,
}
_SMALL: dict[str, dict[str, Any]] = {
    "sd15": {"block_out_channels": [32, 64, 64, 64], "layers_per_block": 1, "attention_head_dim": 8, "cross_attention_dim": 32},
    "sd21": {"block_out_channels": [32, 64, 64, 64], "layers_per_block": 1, "attention_head_dim": [2, 4, 4, 4], "cross_attention_dim": 32},
    "sdxl": {
        "block_out_channels": [32, 64, 64],
        "layers_per_block": 1,
        "transformer_layers_per_block": [1, 1, 2],
        "attention_head_dim": [2, 4, 4],
        "cross_attention_dim": 32,
        "addition_time_embed_dim": 8,
        "projection_class_embeddings_input_dim": 32 + 6 * 8,
    },
}
# Transformer configs, as published (transformer/config.json of each checkpoint).
_SD3: dict[str, Any] = {
    "sample_size": 128,
    "patch_size": 2,
    "in_channels": 16,
    "num_layers": 24,
    "attention_head_dim": 64,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "caption_projection_dim": 1536,
    "pooled_projection_dim": 2048,
    "out_channels": 16,
    "pos_embed_max_size": 192,
}
_SD35: dict[str, Any] = {**_SD3, "pos_embed_max_size": 384, "qk_norm": "rms_norm", "dual_attention_layers": tuple(range(13))}
_FLUX: dict[str, Any] = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": 768,
    "guidance_embeds": True,
    "axes_dims_rope": (16, 56, 56),
}
_PIXART: dict[str, Any] = {
    "sample_size": 128,
    "patch_size": 2,
    "in_channels": 4,
    "out_channels": 8,
    "num_layers": 28,
    "attention_head_dim": 72,
    "num_attention_heads": 16,
    "cross_attention_dim": 1152,
    "caption_channels": 4096,
    "norm_type": "ada_norm_single",
    "norm_elementwise_affine": False,
    "norm_eps": 1e-6,
    "interpolation_scale": 2,
    "use_additional_conditions": False,
}
_SMALL.update(
    {
        "sd3": {
            "num_layers": 2,
            "attention_head_dim": 8,
            "num_attention_heads": 2,
            "joint_attention_dim": 16,
            "caption_projection_dim": 16,
            "pooled_projection_dim": 8,
        },
        "flux": {
            "num_layers": 1,
            "num_single_layers": 2,
            "attention_head_dim": 8,
            "num_attention_heads": 2,
            "joint_attention_dim": 16,
            "pooled_projection_dim": 8,
            "axes_dims_rope": (2, 2, 4),
        },
        "pixart": {"num_layers": 2, "attention_head_dim": 8, "num_attention_heads": 2, "cross_attention_dim": 16, "caption_channels": 16},
    }
)
_SMALL["sd35"] = {**_SMALL["sd3"], "dual_attention_layers": (0,)}
UNETS = ("sd15", "sd21", "sdxl")
TRANSFORMERS = ("sd3", "sd35", "flux", "pixart")
CONFIGS: dict[str, dict[str, Any]] = {
    "sd15": _SD15,
    "sd21": _SD21,
    "sdxl": _SDXL,
    "sd3": _SD3,
    "sd35": _SD35,
    "flux": _FLUX,
    "pixart": _PIXART,
}
# Text tokens each transformer sees at a pipeline's defaults (SD3: 77 CLIP + 256 T5; Flux: 512 T5; PixArt-Σ: 300 T5).
TEXT_TOKENS = {"sd3": 333, "sd35": 333, "flux": 512, "pixart": 300}
VAE_FACTOR = 8


def unet_config(name: str, small: bool = False) -> dict[str, Any]:
    if name not in CONFIGS:
        raise ValueError(f"model must be one of {', '.join(CONFIGS)}, got {name!r}")
    return {**CONFIGS[name], **(_SMALL[name] if small else {})}


def build_model(
    name: str, small: bool = False, seed: int = 0, dtype: torch.dtype = torch.float32, blocks: int | None = None
) -> torch.nn.Module:
    """The diffusers model of ``name`` (a UNet or a transformer) with seeded random weights; ``blocks`` keeps
    only a transformer's first blocks (Flux: that many double-stream and twice as many single-stream blocks)."""
    if name in UNETS:
        if blocks is not None:
            raise ValueError("blocks applies to transformers (sd3, sd35, flux, pixart), not to UNets")
        return build_unet(name, small, seed, dtype)
    import diffusers

    config = unet_config(name, small)
    if blocks is not None:
        if name == "flux":
            config = {
                **config,
                "num_layers": min(blocks, config["num_layers"]),
                "num_single_layers": min(2 * blocks, config["num_single_layers"]),
            }
        else:
            config = {**config, "num_layers": min(blocks, config["num_layers"])}
            if "dual_attention_layers" in config:
                config["dual_attention_layers"] = tuple(i for i in config["dual_attention_layers"] if i < config["num_layers"])
    cls = {
        "sd3": "SD3Transformer2DModel",
        "sd35": "SD3Transformer2DModel",
        "flux": "FluxTransformer2DModel",
        "pixart": "PixArtTransformer2DModel",
    }[name]
    torch.manual_seed(seed)
    model = getattr(diffusers, cls)(**config).eval()
    return model if dtype == torch.float32 else model.to(dtype)


def transformer_inputs(
    model: torch.nn.Module, name: str, height: int, width: int, batch: int = 2, seed: int = 0, text_tokens: int | None = None
) -> dict[str, Any]:
    """Keyword inputs for one transformer forward at a (height, width) latent (Flux: packed 2x2 patches)."""
    config = model.config
    g = torch.Generator().manual_seed(seed)
    dtype = model.dtype
    text = TEXT_TOKENS[name] if text_tokens is None else text_tokens
    t = torch.full((batch,), 500.0)
    if name == "flux":
        h, w = height // 2, width // 2
        ids = torch.zeros(h, w, 3)
        ids[..., 1] = torch.arange(h)[:, None]
        ids[..., 2] = torch.arange(w)[None, :]
        inputs = {
            "hidden_states": torch.randn(batch, h * w, config.in_channels, generator=g).to(dtype),
            "encoder_hidden_states": torch.randn(batch, text, config.joint_attention_dim, generator=g).to(dtype),
            "pooled_projections": torch.randn(batch, config.pooled_projection_dim, generator=g).to(dtype),
            "timestep": t / 1000,
            "img_ids": ids.reshape(h * w, 3),
            "txt_ids": torch.zeros(text, 3),
        }
        if config.guidance_embeds:
            inputs["guidance"] = torch.full((batch,), 3.5)
        return inputs
    latent = torch.randn(batch, config.in_channels, height, width, generator=g).to(dtype)
    if name == "pixart":
        context = torch.randn(batch, text, config.caption_channels, generator=g).to(dtype)
        return {
            "hidden_states": latent,
            "encoder_hidden_states": context,
            "timestep": t,
            "added_cond_kwargs": {"resolution": None, "aspect_ratio": None},
        }
    return {
        "hidden_states": latent,
        "encoder_hidden_states": torch.randn(batch, text, config.joint_attention_dim, generator=g).to(dtype),
        "pooled_projections": torch.randn(batch, config.pooled_projection_dim, generator=g).to(dtype),
        "timestep": t,
    }


def build_unet(name: str, small: bool = False, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A diffusers ``UNet2DConditionModel`` with the architecture of ``name`` and seeded random weights."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(seed)
    unet = UNet2DConditionModel(**unet_config(name, small)).eval()
    return unet if dtype == torch.float32 else unet.to(dtype)


def unet_inputs(unet: torch.nn.Module, height: int, width: int, batch: int = 2, seed: int = 0, text_tokens: int = 77) -> dict[str, Any]:
    """Keyword inputs for one UNet forward at a (height, width) latent: sample, timestep, text (and SDXL's extras)."""
    config = unet.config
    g = torch.Generator().manual_seed(seed)
    dtype = unet.dtype
    inputs: dict[str, Any] = {
        "sample": torch.randn(batch, config.in_channels, height, width, generator=g).to(dtype),
        "timestep": torch.tensor(500),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config.cross_attention_dim, generator=g).to(dtype),
    }
    if config.addition_embed_type == "text_time":
        text_dim = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim
        inputs["added_cond_kwargs"] = {
            "text_embeds": torch.randn(batch, text_dim, generator=g).to(dtype),
            "time_ids": torch.tensor([[height * 8, width * 8, 0, 0, height * 8, width * 8]] * batch, dtype=dtype),
        }
    return inputs
