"""A diffusers pipeline around a bench UNet, for timing whole sampling loops (``tokenmerge bench --steps``) and
combining tokenmerge with accelerators that work across steps (DeepCache) or on a pipeline (FreeU, slicing).

No text encoder and no decoding: the pipeline is called with prompt embeddings and ``output_type="latent"``;
its VAE is a small untrained one that only sets the latent scale factor (8). Accelerators named here:

- ``deepcache``: DeepCache (PyPI ``DeepCache``, ``DeepCacheSDHelper``): full UNet passes every 3 steps, cached
  deep features in between (``cache_branch_id=0``);
- ``freeu``: FreeU (``pipe.enable_freeu``, SD 1.5's published factors);
- ``slicing``: attention slicing (``pipe.enable_attention_slicing()``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

PIPELINE_NAMES = {"deepcache": "DeepCache", "freeu": "FreeU", "slicing": "attention slicing"}  # as a table names them
PIPELINE_ACCELERATORS = tuple(PIPELINE_NAMES)


def latent_pipeline(unet: torch.nn.Module) -> Any:
    """A StableDiffusionPipeline around ``unet`` (a StableDiffusionXLPipeline around an SDXL UNet, whose added
    conditioning it builds) that runs without text encoders, tokenizers or decoding."""
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, StableDiffusionXLPipeline

    vae = AutoencoderKL(
        block_out_channels=[8] * 4,
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        norm_num_groups=8,
        latent_channels=unet.config.in_channels,
    )
    parts = {"vae": vae, "text_encoder": None, "tokenizer": None, "unet": unet, "scheduler": DDIMScheduler()}
    if _pooled_dim(unet):
        pipe = StableDiffusionXLPipeline(**parts, text_encoder_2=None, tokenizer_2=None, add_watermarker=False)
    else:
        pipe = StableDiffusionPipeline(**parts, safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _pooled_dim(unet: torch.nn.Module) -> int:
    """The width of the pooled text embedding an SDXL-style UNet adds to its time embedding (0: none): its
    ``text_time`` projection's input less the six size/crop conditions."""
    config = unet.config
    if config.addition_embed_type != "text_time":
        return 0
    return config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim


def sample_latents(pipe: Any, size_px: int, steps: int, seed: int = 0, batch: int = 1) -> torch.Tensor:
    """One sampling loop (CFG 7.5) from fixed prompt embeddings and noise; returns the final latents."""
    g = torch.Generator().manual_seed(seed)
    dim = pipe.unet.config.cross_attention_dim
    embeds = torch.randn(batch, 77, dim, generator=g)
    negative = torch.randn(batch, 77, dim, generator=g)
    pooled = {}
    if width := _pooled_dim(pipe.unet):
        pooled = {
            "pooled_prompt_embeds": torch.randn(batch, width, generator=g),
            "negative_pooled_prompt_embeds": torch.randn(batch, width, generator=g),
        }
    with torch.inference_mode():
        return pipe(
            prompt_embeds=embeds,
            negative_prompt_embeds=negative,
            **pooled,
            height=size_px,
            width=size_px,
            num_inference_steps=steps,
            generator=torch.Generator().manual_seed(seed),
            output_type="latent",
        ).images


def enable(pipe: Any, accelerator: str, timesteps: tuple[int, ...] = ()) -> Callable[[], None]:
    """Turn ``accelerator`` on for ``pipe``; returns the function that turns it off again. DeepCache also runs on
    a bare UNet sampled by a loop of the given DDIM ``timesteps`` (the reference UNet in ``eval``): it only reads
    the pipeline's ``unet`` and ``scheduler.timesteps``."""
    if accelerator == "deepcache" and not hasattr(pipe, "unet"):
        if not timesteps:
            raise ValueError(f"+deepcache acts on a UNet pipeline or a UNet in a DDIM loop, not on a {type(pipe).__name__}")
        pipe = SimpleNamespace(unet=pipe, scheduler=SimpleNamespace(timesteps=torch.tensor(timesteps)))
    elif accelerator != "deepcache" and not hasattr(pipe, "unet"):
        raise ValueError(f"+{accelerator} acts on a UNet pipeline, not on a {type(pipe).__name__}")
    if accelerator == "deepcache":
        from DeepCache import DeepCacheSDHelper

        helper = DeepCacheSDHelper(pipe=pipe)
        helper.set_params(cache_interval=3, cache_branch_id=0)
        helper.enable()

        def off() -> None:
            helper.disable()
            for module in pipe.unet.modules():  # DeepCache re-assigns the bound methods it saved: drop them
                vars(module).pop("forward", None)

        return off
    if accelerator == "freeu":
        pipe.enable_freeu(s1=0.9, s2=0.2, b1=1.5, b2=1.6)
        return pipe.disable_freeu
    if accelerator == "slicing":
        pipe.enable_attention_slicing()
        return pipe.disable_attention_slicing
    raise ValueError(f"a pipeline's accelerator must be one of {', '.join(PIPELINE_ACCELERATORS)}, got {accelerator!r}")
