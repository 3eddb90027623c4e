"""Arguments are validated once, with errors that name the argument and the allowed values."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import tokenmerge
from tokenmerge import TokenMergeConfig


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(ratio=1.0), ValueError, r"ratio must be a number in \[0, 1\)"),
        (dict(ratio=-0.1), ValueError, r"ratio must be a number in \[0, 1\)"),
        (dict(ratio=math.nan), ValueError, r"ratio must be a number in \[0, 1\), got nan"),
        (dict(ratio="0.5"), TypeError, "ratio must be a number"),
        (dict(ratio=True), TypeError, "ratio must be a number"),
        (dict(sx=0), ValueError, "sx must be an int >= 1"),
        (dict(sy=1.5), TypeError, "sy must be an int >= 1"),
        (dict(max_downsample=3), ValueError, "max_downsample must be None .* power of two"),
        (dict(max_downsample=0), ValueError, "max_downsample must be None .* power of two"),
        (dict(use_rand="yes"), TypeError, "use_rand must be True or False"),
        (dict(merge_mlp=1), TypeError, "merge_mlp must be True or False"),
        (dict(seed=1.5), TypeError, "seed must be None or an int"),
    ],
)
def test_bad_arguments_raise_with_the_allowed_values(sd15_small, kwargs, error, match):
    with pytest.raises(error, match=match):
        TokenMergeConfig(**kwargs)
    with pytest.raises(error, match=match):
        tokenmerge.apply_patch(sd15_small, **kwargs)
    assert tokenmerge.get_config(sd15_small) is None


def test_unknown_keyword_names_it_and_the_valid_ones(sd15_small):
    with pytest.raises(TypeError, match=r"unknown option\(s\) merge_attention; valid options are: ratio, max_downsample"):
        tokenmerge.apply_patch(sd15_small, merge_attention=True)


def test_ratio_above_the_reachable_maximum_warns_with_the_effective_ratio(sd15_small):
    with pytest.warns(UserWarning, match=r"ratio=0.9 exceeds the reachable maximum .* effective ratio is 0.75"):
        tokenmerge.apply_patch(sd15_small, ratio=0.9)
    tokenmerge.remove_patch(sd15_small)
    with pytest.warns(UserWarning, match="effective ratio is 0.666667"):
        tokenmerge.apply_patch(sd15_small, ratio=0.7, sx=3, sy=1)
    tokenmerge.remove_patch(sd15_small)


def test_sdxl_default_level_merges_and_explicit_level_1_warns(sdxl_small):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tokenmerge.apply_patch(sdxl_small)  # auto level: 2 on SDXL, no warning
    state = sdxl_small._tokenmerge_state
    # level 2: one transformer in down_blocks[1], two in up_blocks[1] (layers_per_block=1)
    assert state.top_level == 2 and len(state.merged_blocks()) == 3
    with pytest.warns(UserWarning, match=r"no transformer block is merged: max_downsample=1 .* factors \[2, 4\]"):
        tokenmerge.apply_patch(sdxl_small, max_downsample=1)
    tokenmerge.remove_patch(sdxl_small)


def test_update_options_changes_ratio_without_repatching(sd15_small):
    tokenmerge.apply_patch(sd15_small, ratio=0.5)
    hooks_before = sum(len(m._forward_pre_hooks) for m in sd15_small.modules())
    config = tokenmerge.update_options(sd15_small, ratio=0.25, seed=3)
    assert config.ratio == 0.25 and tokenmerge.get_config(sd15_small) == config
    assert sum(len(m._forward_pre_hooks) for m in sd15_small.modules()) == hooks_before
    with pytest.raises(ValueError, match="ratio must be"):
        tokenmerge.update_options(sd15_small, ratio=2)
    with pytest.raises(TypeError, match="unknown option"):
        tokenmerge.update_options(sd15_small, rate=0.2)
    tokenmerge.remove_patch(sd15_small)
    with pytest.raises(ValueError, match="not patched"):
        tokenmerge.update_options(sd15_small, ratio=0.3)


@pytest.mark.parametrize("model", ["a string", torch.nn.Linear(4, 4), None])
def test_unsupported_objects_raise_type_error_saying_what_is_accepted(model):
    with pytest.raises(TypeError, match="accepts a diffusers DiffusionPipeline|expected a diffusers DiffusionPipeline"):
        tokenmerge.apply_patch(model)


def test_dit_pipeline_raises_a_clear_error():
    from diffusers import AutoencoderKL, DDIMScheduler, DiTPipeline, DiTTransformer2DModel

    transformer = DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, num_layers=2, sample_size=8, patch_size=2, num_embeds_ada_norm=10
    )
    vae = AutoencoderKL(block_out_channels=[32], norm_num_groups=32, latent_channels=4)
    pipe = DiTPipeline(transformer=transformer, vae=vae, scheduler=DDIMScheduler())
    with pytest.raises(TypeError, match="DiTPipeline has no transformer blocks that tokenmerge can patch; .* DiTTransformer2DModel"):
        tokenmerge.apply_patch(pipe)
