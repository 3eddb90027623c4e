"""Hooks leave upstream forwards in charge: every block variant runs unchanged at ratio 0 and merges at 0.5.

tomesd copies ``BasicTransformerBlock.forward`` and so ignores pos_embed, GLIGEN and feed-forward
chunking, crashes on newer norm types, on keyword calls of the UNet and on 5-D video UNets.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from diffusers import (
    AutoencoderKL,
    ControlNetModel,
    DDIMScheduler,
    StableDiffusionControlNetPipeline,
    Transformer2DModel,
    UNetMotionModel,
    UNetSpatioTemporalConditionModel,
)
from diffusers.models.attention import BasicTransformerBlock

import tokenmerge

from conftest import attn1_token_counts, sd_inputs


def check_patch(model, run: Callable[[], torch.Tensor], patch_target=None, **options) -> list[int]:
    """ratio 0 is bit-identical to unpatched; ratio 0.5 merges and stays finite; removal restores.

    Returns the token counts attn1 saw at ratio 0.5."""
    target = model if patch_target is None else patch_target
    with torch.no_grad():
        vanilla = run()
        tokenmerge.apply_patch(target, ratio=0.0, **options)
        assert torch.equal(run(), vanilla)
        tokenmerge.apply_patch(target, ratio=0.5, **options)
        with attn1_token_counts(model) as counts:
            merged = run()
        assert torch.isfinite(merged).all()
        assert not torch.equal(merged, vanilla)
        tokenmerge.remove_patch(target)
        assert torch.equal(run(), vanilla)
    return counts


def test_unet_called_with_keywords(sd15_small):
    inputs = sd_inputs(sd15_small, 16, 16)
    counts = check_patch(sd15_small, lambda: sd15_small(**inputs).sample)
    assert 128 in counts and 256 not in counts  # top-level blocks see half of the 16x16 tokens


def test_sdxl_merges_at_its_highest_attention_level(sdxl_small):
    inputs = sd_inputs(sdxl_small, 16, 16)
    counts = check_patch(sdxl_small, lambda: sdxl_small(**inputs).sample)
    assert 32 in counts and 64 not in counts  # level 2 has 8x8 tokens, merged to 32


def _t2d(**config) -> Transformer2DModel:
    torch.manual_seed(0)
    base = dict(num_attention_heads=2, attention_head_dim=16, in_channels=32, cross_attention_dim=24, norm_num_groups=32)
    return Transformer2DModel(**{**base, **config}).eval()


def _grid_inputs(batch: int = 2, size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(batch, 32, size, size, generator=g), torch.randn(batch, 5, 24, generator=g)


@pytest.mark.parametrize(
    "norm_type,extra_config,call_kwargs",
    [
        ("layer_norm", {}, lambda b: {}),
        ("ada_norm", {"num_embeds_ada_norm": 10}, lambda b: {"timestep": torch.tensor(3)}),  # one timestep for the batch
        (
            "ada_norm_zero",
            {"num_embeds_ada_norm": 10},
            lambda b: {"timestep": torch.tensor([3] * b), "class_labels": torch.tensor([1] * b)},
        ),
        ("ada_norm_single", {}, lambda b: {"timestep": torch.randn(b, 6 * 32, generator=torch.Generator().manual_seed(2))}),
    ],
)
def test_norm_types(norm_type, extra_config, call_kwargs):
    model = _t2d(norm_type=norm_type, **extra_config)
    x, context = _grid_inputs()
    run = lambda: model(x, encoder_hidden_states=context, **call_kwargs(2)).sample  # noqa: E731
    assert 32 in check_patch(model, run, merge_crossattn=True, merge_mlp=True)


class PooledTransformer2D(Transformer2DModel):
    """A spatial transformer whose blocks take ``added_cond_kwargs`` (as ``ada_norm_continuous`` needs).

    Transformer2DModel does not pass that argument on; this mirrors how a model using such blocks
    (e.g. aMUSEd's UVit) runs them on a (B, C, H, W) map, reusing the upstream input/output helpers."""

    def forward(self, hidden_states, encoder_hidden_states=None, pooled_text_emb=None):
        batch, _, height, width = hidden_states.shape
        residual = hidden_states
        tokens, inner_dim = self._operate_on_continuous_inputs(hidden_states)
        for block in self.transformer_blocks:
            tokens = block(tokens, encoder_hidden_states=encoder_hidden_states, added_cond_kwargs={"pooled_text_emb": pooled_text_emb})
        return self._get_output_for_continuous_inputs(tokens, residual, batch, height, width, inner_dim)[0]


def test_ada_norm_continuous():
    model = PooledTransformer2D(num_attention_heads=2, attention_head_dim=16, in_channels=32, cross_attention_dim=24, norm_num_groups=32)
    torch.manual_seed(0)
    model.transformer_blocks = torch.nn.ModuleList(
        BasicTransformerBlock(
            32, 2, 16, cross_attention_dim=24, norm_type="ada_norm_continuous", ada_norm_continous_conditioning_embedding_dim=12
        )
        for _ in range(2)
    )
    model.eval()
    x, context = _grid_inputs()
    pooled = torch.randn(2, 12)
    assert 32 in check_patch(model, lambda: model(x, context, pooled), merge_crossattn=True, merge_mlp=True)


def test_sinusoidal_pos_embed():
    model = _t2d()
    torch.manual_seed(0)
    model.transformer_blocks = torch.nn.ModuleList(
        [BasicTransformerBlock(32, 2, 16, cross_attention_dim=24, positional_embeddings="sinusoidal", num_positional_embeddings=64)]
    )
    x, context = _grid_inputs()
    assert model.transformer_blocks[0].pos_embed is not None
    assert 32 in check_patch(model, lambda: model(x, encoder_hidden_states=context).sample)


def test_gligen_fuser():
    model = _t2d(attention_type="gated")
    x, context = _grid_inputs()
    objs = torch.randn(2, 3, 24, generator=torch.Generator().manual_seed(3))
    run = lambda: model(x, encoder_hidden_states=context, cross_attention_kwargs={"gligen": {"objs": objs}}).sample  # noqa: E731
    assert model.transformer_blocks[0].fuser is not None
    assert 32 in check_patch(model, run)


def test_feed_forward_chunking_along_the_batch_merges_the_mlp():
    model = _t2d(num_layers=2)
    x, context = _grid_inputs(batch=3)
    run = lambda: model(x, encoder_hidden_states=context).sample  # noqa: E731
    with torch.no_grad():
        tokenmerge.apply_patch(model, ratio=0.5, merge_mlp=True, use_rand=False)
        unchunked = run()
        for block in model.transformer_blocks:
            block.set_chunk_feed_forward(1, dim=0)
        torch.testing.assert_close(run(), unchunked)  # same result, one sample at a time
        tokenmerge.remove_patch(model)
    check_patch(model, run, merge_mlp=True)


def test_feed_forward_chunking_along_tokens_warns_and_runs_the_mlp_unmerged():
    model = _t2d()
    model.transformer_blocks[0].set_chunk_feed_forward(16, dim=1)
    x, context = _grid_inputs()
    run = lambda: model(x, encoder_hidden_states=context).sample  # noqa: E731
    with torch.no_grad():
        tokenmerge.apply_patch(model, ratio=0.5, merge_mlp=False)
        without_mlp = run()
        tokenmerge.apply_patch(model, ratio=0.5, merge_mlp=True)
        with pytest.warns(UserWarning, match="feed-forward chunking along the sequence"):
            with_mlp = run()
        tokenmerge.remove_patch(model)
    torch.testing.assert_close(with_mlp, without_mlp)


def test_animatediff_motion_unet_merges_spatial_blocks_per_frame():
    torch.manual_seed(0)
    unet = UNetMotionModel(
        block_out_channels=(32, 64),
        norm_num_groups=32,
        down_block_types=("CrossAttnDownBlockMotion", "DownBlockMotion"),
        up_block_types=("UpBlockMotion", "CrossAttnUpBlockMotion"),
        cross_attention_dim=32,
        num_attention_heads=4,
        layers_per_block=1,
        sample_size=16,
    ).eval()
    frames = 3
    x = torch.randn(1, 4, frames, 16, 16)
    context = torch.randn(frames, 7, 32)  # the pipeline repeats the prompt per frame
    run = lambda: unet(x, 10, encoder_hidden_states=context).sample  # noqa: E731
    counts = check_patch(unet, run)
    assert 128 in counts  # spatial: 16x16 tokens per frame, halved
    assert frames in counts  # temporal blocks (sequence = frames) are left alone


def test_stable_video_diffusion_unet_merges_spatial_blocks_only():
    torch.manual_seed(0)
    unet = UNetSpatioTemporalConditionModel(
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
        up_block_types=("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"),
        cross_attention_dim=32,
        num_attention_heads=(8, 16),
        projection_class_embeddings_input_dim=96,
        addition_time_embed_dim=32,
        layers_per_block=2,
        sample_size=16,
        in_channels=8,
        out_channels=4,
    ).eval()
    x = torch.randn(1, 3, 8, 16, 16)
    context, time_ids = torch.randn(1, 1, 32), torch.randn(1, 3)
    run = lambda: unet(x, 10, encoder_hidden_states=context, added_time_ids=time_ids).sample  # noqa: E731
    counts = check_patch(unet, run)
    assert 128 in counts and 256 not in counts  # every spatial block at the top level is merged


@pytest.fixture(scope="module")
def controlnet_pipeline(sd15_small):
    torch.manual_seed(0)
    vae = AutoencoderKL(
        block_out_channels=[32] * 4,
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        norm_num_groups=32,
    )
    controlnets = [ControlNetModel.from_unet(sd15_small), ControlNetModel.from_unet(sd15_small)]
    return StableDiffusionControlNetPipeline(
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        unet=sd15_small,
        controlnet=controlnets,
        scheduler=DDIMScheduler(),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def test_controlnet_pipeline_patches_the_unet_and_every_controlnet(controlnet_pipeline):
    pipe = controlnet_pipeline
    pipe.set_progress_bar_config(disable=True)
    embeds = torch.randn(1, 7, 32, generator=torch.Generator().manual_seed(4))
    image = torch.rand(1, 3, 128, 128, generator=torch.Generator().manual_seed(5))
    kwargs = dict(prompt_embeds=embeds, negative_prompt_embeds=-embeds, image=[image, image], num_inference_steps=2, height=128, width=128)

    def run():
        return torch.from_numpy(pipe(**kwargs, output_type="np", generator=torch.Generator().manual_seed(0)).images)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        tokenmerge.apply_patch(pipe)
        patched = [d.name for d in tokenmerge.describe(pipe).denoisers]
        tokenmerge.remove_patch(pipe)
        assert sorted(patched) == ["ControlNetModel", "ControlNetModel", "UNet2DConditionModel"]
        counts_by_model = {}
        for name, model in [("unet", pipe.unet), ("controlnet", pipe.controlnet.nets[0])]:
            counts_by_model[name] = check_patch(model, run, patch_target=pipe)
    assert 128 in counts_by_model["unet"] and 128 in counts_by_model["controlnet"]
    assert tokenmerge.remove_patch(pipe) is pipe.unet  # tomesd's return value
