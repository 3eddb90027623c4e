"""Arguments are validated once, with errors that name the argument and the allowed values."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import tokenmerge
from tokenmerge import TokenMergeConfig

from conftest import sd_inputs


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
        (dict(merge_mlp=1), TypeError, "merge_mlp must be None or True or False"),
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
    described = tokenmerge.describe(sdxl_small).denoisers[0]
    # level 2: one transformer in down_blocks[1], two in up_blocks[1] (layers_per_block=1)
    assert described.top_level == 2 and len(described.patched_blocks) == 3
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


def test_model_without_transformer_blocks_raises_a_clear_error():
    from diffusers import UNet2DModel

    unet = UNet2DModel(
        block_out_channels=(32, 32), down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D")
    )
    with pytest.raises(TypeError, match="UNet2DModel: no supported model family"):
        tokenmerge.apply_patch(unet)


@pytest.mark.parametrize(
    "options",
    [
        dict(ratio=np.float32(0.5)),
        dict(ratio=torch.tensor(0.5)),
        dict(sx=np.int64(2), sy=np.int32(2)),
        dict(seed=np.int64(3)),
        dict(max_downsample=np.int64(2)),
        dict(kv_factor=torch.tensor(3), method="todo"),
        dict(use_rand=np.bool_(False)),
    ],
)
def test_numpy_and_tensor_scalars_are_accepted_as_drop_in_code_passes_them(options):
    config = tokenmerge.TokenMergeConfig(**options)
    for name, value in options.items():
        plain = value.item() if hasattr(value, "item") else value
        assert getattr(config, name) == plain and type(getattr(config, name)) in (int, float, bool, str)


@pytest.mark.parametrize(
    "options,error",
    [
        (dict(ratio=True), TypeError),
        (dict(ratio="0.5"), TypeError),
        (dict(sx=np.float64(2.0)), TypeError),
        (dict(seed="3"), TypeError),
        (dict(seed=True), TypeError),
        (dict(ratio=torch.tensor([0.5])), TypeError),
        (dict(use_rand=1), TypeError),
    ],
)
def test_bools_strings_and_non_scalars_are_still_rejected(options, error):
    with pytest.raises(error, match=next(iter(options))):
        tokenmerge.TokenMergeConfig(**options)


def test_any_python_int_is_a_seed_and_all_its_bits_count(sd15_small, recorded_plans):
    def destinations(seed: int) -> torch.Tensor:
        recorded_plans.clear()
        with tokenmerge.patched(sd15_small, ratio=0.5, seed=seed, max_downsample=1), torch.no_grad():
            sd15_small(**sd_inputs(sd15_small, 16, 16))
        return recorded_plans[0].keep_idx

    big = 2**64 + 5  # torch.seed() returns values >= 2**63 half the time
    seeds = [0, 5, 2**32 + 5, 2**63 + 5, big, -5]
    found = [destinations(s) for s in seeds]
    assert torch.equal(found[0], destinations(0))  # deterministic
    for i in range(len(seeds)):
        for j in range(i):
            assert not torch.equal(found[i], found[j]), (seeds[i], seeds[j])  # seeds differing above bit 32 differ too


def test_match_dtype_takes_torch_dtypes_as_their_names():
    assert tokenmerge.TokenMergeConfig(match_dtype=torch.bfloat16).match_dtype == "bfloat16"
    assert tokenmerge.TokenMergeConfig(match_dtype="float16").match_dtype == "float16"
    with pytest.raises(ValueError, match=r"match_dtype must be None or float32, float16, bfloat16 \(or the torch dtypes"):
        tokenmerge.TokenMergeConfig(match_dtype=torch.int8)
