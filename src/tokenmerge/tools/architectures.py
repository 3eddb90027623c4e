"""The architectures of SD 1.5, SD 2.1, SDXL (UNets) and of every transformer a family module describes (SD3,
Flux.1, PixArt, ...: their :class:`tokenmerge.families.Example`), built from the configs of the published
checkpoints with random weights.

Nothing is downloaded: benchmarks and tests build the real diffusers classes (``small=True`` shrinks widths
and depths, keeping the block structure, for fast tests; ``blocks`` keeps a transformer's full width but only
its first blocks, where the whole model does not fit in memory or time: every block of a transformer is the
same computation, so the per-block speed-up carries over). Used by the CLI and tests only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .examples import examples

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
UNETS = ("sd15", "sd21", "sdxl")
CONFIGS: dict[str, dict[str, Any]] = {"sd15": _SD15, "sd21": _SD21, "sdxl": _SDXL}
# Transformers: every published model a family module describes (tokenmerge.families, its Example), by bench name.
TRANSFORMERS = tuple(examples())
TEXT_TOKENS = {name: example.text_tokens for name, (_, example) in examples().items()}
VAE_FACTOR = 8


def unet_config(name: str, small: bool = False) -> dict[str, Any]:
    """The published config of ``name`` (a UNet or a transformer), with the tiny overrides when ``small``."""
    if name in CONFIGS:
        return {**CONFIGS[name], **(_SMALL[name] if small else {})}
    if name in TRANSFORMERS:
        example = examples()[name][1]
        return {**example.config, **(example.small if small else {})}
    raise ValueError(f"model must be one of {', '.join((*UNETS, *TRANSFORMERS))}, got {name!r}")


def build_model(
    name: str,
    small: bool = False,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    blocks: int | None = None,
    overrides: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """The diffusers model of ``name`` (a UNet or a transformer) with seeded random weights; ``blocks`` keeps
    only a transformer's first blocks (as its family's example says: Flux.1 keeps that many double-stream and
    twice as many single-stream blocks); ``overrides``: config keys of another published model of the same
    architecture (FLUX.2 [klein]'s widths on Flux.2's example)."""
    if name in UNETS:
        if blocks is not None or overrides:
            raise ValueError(f"blocks and overrides apply to transformers ({', '.join(TRANSFORMERS)}), not to UNets")
        return build_unet(name, small, seed, dtype)
    import diffusers

    config = {**unet_config(name, small), **(overrides or {})}
    example = examples()[name][1]
    if blocks is not None:
        if example.blocks is None:
            raise ValueError(f"{name} cannot be built with only its first blocks")
        config = example.blocks(config, blocks)
    torch.manual_seed(seed)
    model = getattr(diffusers, example.cls)(**config).eval()
    return model if dtype == torch.float32 else model.to(dtype)


def transformer_inputs(
    model: torch.nn.Module,
    name: str,
    height: int,
    width: int,
    batch: int = 2,
    seed: int = 0,
    text_tokens: int | None = None,
    frames: int | None = None,
) -> dict[str, Any]:
    """Keyword inputs for one transformer forward at a (height, width) latent, as its pipeline passes them; a video
    model's at ``frames`` latent frames (default: its inputs' own, a few)."""
    example = examples()[name][1]
    extra = {"frames": frames} if example.frames and frames is not None else {}
    return example.inputs(model, height, width, batch, seed, example.text_tokens if text_tokens is None else text_tokens, **extra)


def transformer_output(name: str, output: Any) -> torch.Tensor:
    """The denoised latent of a transformer's output (as its family's example reads it)."""
    example = examples()[name][1]
    return example.output(output) if example.output is not None else denoised(output)


def denoised(output: Any) -> torch.Tensor:
    """The tensor of a model's output: ``.sample``, the first element of a tuple, or a list of samples stacked."""
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "sample"):
        output = output.sample
    elif isinstance(output, tuple):
        output = output[0]
    return torch.stack(list(output)) if isinstance(output, list) else output


# The noise level of a bench forward (1 = pure noise): a step every method's default reduces (auto's reduces the
# steps at or below 0.4, the others every step), so one forward times a reduced step. Whole loops: ``--steps``.
BENCH_NOISE = 0.25
TIMESTEP_KEYS = ("timestep", "timesteps", "t")  # the names the families' examples use (Z-Image: t)


def timestep_scale(model: torch.nn.Module) -> tuple[float, float]:
    """The timestep ``model`` takes at pure noise and when clean: its family's, else the common (1000, 0)."""
    from ..families import family_of

    family = family_of(model)
    return family.timesteps if family is not None else (1000.0, 0.0)


def at_noise(inputs: dict[str, Any], scale: tuple[float, float], level: float) -> dict[str, Any]:
    """``inputs`` with their timestep set to noise ``level`` (1 = pure noise) on the family's ``scale`` (its timestep
    at pure noise and when clean); a per-token timestep's clean entries (a condition frame) stay clean."""
    noisy, clean = scale
    moved = dict(inputs)
    for key in TIMESTEP_KEYS:
        if key in inputs:
            t = inputs[key]
            at = torch.full_like(t, clean + (noisy - clean) * level, dtype=torch.float32)
            moved[key] = torch.where(t == clean, t.float(), at).to(t.dtype)
    return moved


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


def meta_model(name: str) -> torch.nn.Module:
    """The published architecture of ``name`` on the meta device: every module and shape, no memory, no weights (for
    ``tokenmerge describe``: what a patch does needs no forward)."""
    with torch.device("meta"):
        return build_model(name)


def meta_pipeline(folder: str | Path) -> Any:
    """A diffusers pipeline folder's pipeline with its scheduler and, on the meta device, every model of a family
    tokenmerge knows (built from its ``config.json``: no weights read); its other components (encoders, VAE) absent.
    For ``tokenmerge describe``."""
    import json

    import diffusers

    from ..families import family_of

    folder = Path(folder)
    index = folder / "model_index.json"
    if not index.is_file():
        raise FileNotFoundError(f"{folder} is not a diffusers pipeline folder (it has no model_index.json)")
    entries = json.loads(index.read_text())
    cls = getattr(diffusers, entries["_class_name"], None)
    if cls is None:
        raise ValueError(f"{folder}: diffusers {diffusers.__version__} has no pipeline {entries['_class_name']}")
    components: dict[str, Any] = {}
    for key, value in entries.items():
        if key.startswith("_"):
            continue
        if not (isinstance(value, list) and len(value) == 2):
            components[key] = value  # a pipeline setting (Wan 2.2's boundary_ratio, ...)
            continue
        component = getattr(diffusers, value[1] or "", None)
        if component is None:
            components[key] = None
        elif key == "scheduler":
            components[key] = component.from_pretrained(folder, subfolder=key)
        elif issubclass(component, torch.nn.Module):
            with torch.device("meta"):
                model = component.from_config(component.load_config(folder / key))
            components[key] = model if family_of(model) is not None else None
        else:
            components[key] = None
    return cls(**components)
