"""SD3, Flux and PixArt pipelines (and the SD3 / Flux ControlNet pipelines): apply_patch on the pipeline patches the
transformer and the control transformer; whole sampling runs (prompt embeddings given, no text encoders, latents
out) change under the patch and are restored exactly after it."""

from __future__ import annotations

import pytest
import torch

import tokenmerge
from tokenmerge.tools.architectures import build_model, unet_config

SIZE = 64  # px: an 8x8 latent, a 4x4 patch grid


def _vae(latent_channels: int):
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    blocks = dict(down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4)
    # 16-channel latents are the SD3 / Flux VAE, which shifts latents (the Flux ControlNet pipeline needs the shift)
    shift = dict(shift_factor=0.0) if latent_channels == 16 else {}
    return AutoencoderKL(block_out_channels=[8] * 4, **blocks, norm_num_groups=8, latent_channels=latent_channels, **shift)


def _embeds(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g) for s in shapes]


def sd3_pipeline(controlnet: bool):
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3ControlNetModel, StableDiffusion3ControlNetPipeline, StableDiffusion3Pipeline

    transformer = build_model("sd3", small=True)
    parts = dict(transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(), vae=_vae(16))
    parts |= {f"{kind}{suffix}": None for kind in ("text_encoder", "tokenizer") for suffix in ("", "_2", "_3")}
    config = transformer.config
    prompt, pooled, negative, negative_pooled = _embeds(
        (1, 5, config.joint_attention_dim),
        (1, config.pooled_projection_dim),
        (1, 5, config.joint_attention_dim),
        (1, config.pooled_projection_dim),
    )
    call = dict(
        prompt_embeds=prompt, pooled_prompt_embeds=pooled, negative_prompt_embeds=negative, negative_pooled_prompt_embeds=negative_pooled
    )
    if not controlnet:
        return StableDiffusion3Pipeline(**parts), call
    torch.manual_seed(1)
    net = SD3ControlNetModel(
        **{k: v for k, v in unet_config("sd3", small=True).items() if k != "pos_embed_max_size"}, pos_embed_max_size=16
    )
    pipe = StableDiffusion3ControlNetPipeline(**parts, controlnet=net)
    return pipe, call | dict(control_image=torch.rand(1, 3, SIZE, SIZE), controlnet_conditioning_scale=1.0)


def flux_pipeline(controlnet: bool):
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxControlNetModel, FluxControlNetPipeline, FluxPipeline

    transformer = build_model("flux", small=True)
    parts = dict(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=_vae(16),
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
    )
    config = transformer.config
    prompt, pooled = _embeds((1, 5, config.joint_attention_dim), (1, config.pooled_projection_dim))
    call = dict(prompt_embeds=prompt, pooled_prompt_embeds=pooled, guidance_scale=3.5)
    if not controlnet:
        return FluxPipeline(**parts), call
    torch.manual_seed(1)
    small = unet_config("flux", small=True)
    net = FluxControlNetModel(
        **{
            k: small[k]
            for k in (
                "patch_size",
                "in_channels",
                "num_layers",
                "num_single_layers",
                "attention_head_dim",
                "num_attention_heads",
                "joint_attention_dim",
                "pooled_projection_dim",
                "guidance_embeds",
                "axes_dims_rope",
            )
        }
    )
    pipe = FluxControlNetPipeline(**parts, controlnet=net)
    return pipe, call | dict(control_image=torch.rand(1, 3, SIZE, SIZE), controlnet_conditioning_scale=1.0)


def pixart_pipeline(controlnet: bool):
    from diffusers import DPMSolverMultistepScheduler, PixArtSigmaPipeline

    transformer = build_model("pixart", small=True)
    pipe = PixArtSigmaPipeline(
        tokenizer=None, text_encoder=None, vae=_vae(4), transformer=transformer, scheduler=DPMSolverMultistepScheduler()
    )
    dim = transformer.config.caption_channels
    prompt, negative = _embeds((1, 5, dim), (1, 5, dim))
    mask = torch.ones(1, 5, dtype=torch.long)
    call = dict(
        prompt_embeds=prompt,
        prompt_attention_mask=mask,
        negative_prompt=None,
        negative_prompt_embeds=negative,
        negative_prompt_attention_mask=mask,
        use_resolution_binning=False,
    )
    return pipe, call


PIPELINES = {
    "SD3": (sd3_pipeline, False),
    "SD3 ControlNet": (sd3_pipeline, True),
    "Flux": (flux_pipeline, False),
    "Flux ControlNet": (flux_pipeline, True),
    "PixArt-Sigma": (pixart_pipeline, False),
}


@pytest.mark.parametrize("name", PIPELINES)
@pytest.mark.parametrize("options", [dict(ratio=0.5), dict(method="todo", kv_factor=2)], ids=["tome", "todo"])
def test_pipeline_sampling_is_patched_and_restored(name, options):
    build, controlnet = PIPELINES[name]
    pipe, call = build(controlnet)
    pipe.set_progress_bar_config(disable=True)

    def run() -> torch.Tensor:
        with torch.no_grad():
            return pipe(
                **call, height=SIZE, width=SIZE, num_inference_steps=2, generator=torch.Generator().manual_seed(0), output_type="latent"
            ).images

    vanilla = run()
    tokenmerge.apply_patch(pipe, **options)
    patched = {d.name for d in tokenmerge.describe(pipe).denoisers}
    assert "ControlNet" in " ".join(patched) if controlnet else len(patched) == 1
    out = run()
    assert torch.isfinite(out).all() and not torch.equal(out, vanilla)
    assert torch.equal(run(), out)  # deterministic
    tokenmerge.remove_patch(pipe)
    assert torch.equal(run(), vanilla)
