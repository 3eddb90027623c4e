"""``tokenmerge.describe``: sizes in tokens or pixels (converted per family), what the noise gate does with a
pipeline's steps, and each denoiser named by where it sits (Wan 2.2's two experts)."""

from __future__ import annotations

import pytest

import tokenmerge
from tokenmerge.tools.architectures import build_model


def _flux_pipeline():
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_image_seq_len=256, max_image_seq_len=4096, base_shift=0.5, max_shift=1.15
    )  # FLUX.1-dev's scheduler config
    none = dict.fromkeys(("vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2"))
    return FluxPipeline(scheduler=scheduler, transformer=build_model("flux", small=True), **none)


def _wan22_pipeline(boundary_ratio: float = 0.875):
    from diffusers import UniPCMultistepScheduler, WanPipeline

    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=12.0)
    return WanPipeline(
        tokenizer=None,
        text_encoder=None,
        vae=None,
        scheduler=scheduler,
        transformer=build_model("wan", small=True),
        transformer_2=build_model("wan", small=True),
        boundary_ratio=boundary_ratio,
    )


def test_a_size_in_pixels_is_converted_per_family(sd15_small):
    with tokenmerge.patched(sd15_small, ratio=0.5):
        assert "(128x128)" in str(tokenmerge.describe(sd15_small, size=1024))  # SD: the 8 px latent
    flux = build_model("flux", small=True)
    with tokenmerge.patched(flux, method="auto"):
        (found,) = tokenmerge.describe(flux, size=(1024, 768)).denoisers
        assert str(found.grid) == "64x48" and "at a 64x48 token grid" in str(found)  # 16 px per token
    wan = build_model("wan", small=True)
    with tokenmerge.patched(wan, method="auto"):
        assert str(tokenmerge.describe(wan, size=(480, 832), frames=81).denoisers[0].grid) == "21x30x52"
        with pytest.raises(ValueError, match="is a video model: give frames="):
            tokenmerge.describe(wan, size=480)


@pytest.mark.parametrize(
    "grid,error,match",
    [
        (64, TypeError, r"grid must be a token grid: \(h, w\) or \(frames, h, w\) tokens.*use size="),
        ((1024, 1024), ValueError, r"a size in pixels or latent cells\?.*size=1024"),
    ],
)
def test_a_grid_that_is_not_tokens_is_refused_with_the_way_to_say_it(sd15_small, grid, error, match):
    with tokenmerge.patched(sd15_small, ratio=0.5), pytest.raises(error, match=match):
        tokenmerge.describe(sd15_small, grid=grid)


@pytest.mark.parametrize(
    "size,reduced", [(1024, "reduces 4 of 28 (steps 25-28); the others"), (2048, "reduces 0 of 28: all at noise above max_noise=0.4")]
)
def test_steps_count_what_the_noise_gate_reduces_of_a_pipelines_schedule(size, reduced):
    """Flux.1 shifts its schedule by the token count: auto's default (noise <= 0.4) reduces 4 of 28 steps at 1024 px
    and none at 2048 px, said before a generation runs."""
    pipe = _flux_pipeline()
    with tokenmerge.patched(pipe, method="auto"):
        text = str(tokenmerge.describe(pipe, size=size, steps=28))
    assert f"steps: {reduced}" in text and text.startswith("transformer: FluxTransformer2DModel")


def test_wan22s_experts_are_named_each_with_its_share_of_the_steps():
    pipe = _wan22_pipeline()
    with tokenmerge.patched(pipe, method="auto"):
        first, second = tokenmerge.describe(pipe, size=(480, 832), frames=81, steps=40).denoisers
    assert (first.component, second.component) == ("transformer", "transformer_2")
    assert first.steps.startswith("runs 26 of the 40 steps; reduces 0 of 26")  # the noisy expert: every step above 0.4
    assert second.steps == "runs 14 of the 40 steps; reduces 2 of 14 (steps 39-40); the others are at noise above max_noise=0.4"


def test_steps_need_a_pipeline_and_its_size(sd15_small):
    with tokenmerge.patched(sd15_small, ratio=0.5), pytest.raises(TypeError, match="not a diffusers pipeline"):
        tokenmerge.describe(sd15_small, size=512, steps=20)
    pipe = _flux_pipeline()
    with tokenmerge.patched(pipe, method="auto"), pytest.raises(TypeError, match="needs the image size"):
        tokenmerge.describe(pipe, steps=28)
