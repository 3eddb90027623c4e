"""The UNets outside the bench's three: ModelScope's/ZeroScope's 3-D UNet and the ControlNet-XS UNet, on tiny configs
of their real diffusers classes.

Identity options bit-identical, removal exact; tome, todo and auto act on the top level's spatial self-attentions
only: the 3-D UNet's temporal transformers (a sequence of frames per spatial position, no token grid) and the
lower levels keep every token; ControlNet-XS downsamples through its own ``base_downsamplers``, whose levels its
family follows (the structural UNet family would have taken every block for the top level).
"""

from __future__ import annotations

import pytest
import torch

import tokenmerge
from tokenmerge.families import family_of

from conftest import attn1_token_counts

METHODS = {
    "tome": dict(ratio=0.5),
    "todo": dict(method="todo", kv_factor=2),
    "auto": dict(method="auto", auto_max_keys=16, auto_min_tokens=16, max_noise=1),
}


def _unet3d():
    from diffusers import UNet3DConditionModel

    torch.manual_seed(0)
    unet = UNet3DConditionModel(
        block_out_channels=(32, 64),
        norm_num_groups=32,
        layers_per_block=1,
        cross_attention_dim=32,
        attention_head_dim=8,
        down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
        up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"),
        sample_size=16,
    ).eval()
    x, context = torch.randn(2, 4, 3, 16, 16), torch.randn(2, 7, 32)
    return unet, lambda t=10: unet(x, t, encoder_hidden_states=context).sample


def _controlnet_xs():
    from diffusers import UNetControlNetXSModel

    torch.manual_seed(0)
    unet = UNetControlNetXSModel(
        sample_size=16,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        block_out_channels=(32, 64),
        norm_num_groups=4,
        cross_attention_dim=32,
        num_attention_heads=2,
        ctrl_conditioning_embedding_out_channels=(2, 2),
        ctrl_block_out_channels=(4, 8),
        ctrl_num_attention_heads=1,
        ctrl_max_norm_num_groups=2,
    ).eval()
    x, context, cond = torch.randn(2, 4, 16, 16), torch.randn(2, 7, 32), torch.randn(2, 3, 32, 32)
    return unet, lambda t=10: unet(x, t, encoder_hidden_states=context, controlnet_cond=cond).sample


# name -> (builder, its family)
MODELS = {"unet3d": (_unet3d, "unet3d"), "controlnet-xs": (_controlnet_xs, "controlnet-xs")}
TOP = 256  # tokens of the top level's grid (the 16x16 latent)


@pytest.mark.parametrize("name", MODELS)
def test_identity_is_bit_identical_and_removal_exact(name):
    build, family = MODELS[name]
    model, run = build()
    assert family_of(model).name == family
    with torch.no_grad():
        vanilla = run()
        with tokenmerge.patched(model, ratio=0.0):
            assert torch.equal(run(), vanilla)
        with tokenmerge.patched(model, ratio=0.5):
            assert not torch.equal(run(), vanilla)
        assert torch.equal(run(), vanilla)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("method", METHODS)
def test_only_the_top_levels_spatial_attentions_are_reduced(name, method):
    model, run = MODELS[name][0]()
    with torch.no_grad(), attn1_token_counts(model) as plain:
        vanilla = run()
    with torch.no_grad(), tokenmerge.patched(model, **METHODS[method]), attn1_token_counts(model) as patched:
        out = run()
    assert torch.isfinite(out).all() and not torch.equal(out, vanilla)
    assert len(plain) == len(patched)
    for before, after in zip(plain, patched):
        # tome merges the top level's queries; todo/auto keep queries (their keys are reduced): other counts unchanged
        assert after == before or (method == "tome" and before == TOP and after < before), (before, after)


@pytest.mark.parametrize("name", MODELS)
def test_the_token_cache_acts_on_the_cached_steps_only(name):
    """A generation's full steps (the first two under these options) equal vanilla; the cached ones recompute half
    of the top level's spatial tokens: close to vanilla, not equal."""
    model, run = MODELS[name][0]()
    timesteps = (900, 700, 500, 300)  # a generation's falling noise
    with torch.no_grad():
        vanilla = [run(t) for t in timesteps]
        with tokenmerge.patched(model, method="tokencache", recompute=0.5, full_steps=1, refresh_every=10), tokenmerge.generation(model):
            steps = [run(t) for t in timesteps]
    assert torch.equal(steps[0], vanilla[0]) and torch.equal(steps[1], vanilla[1])
    for cached, plain in zip(steps[2:], vanilla[2:]):
        assert torch.isfinite(cached).all() and 0 < ((cached - plain).norm() / plain.norm()).item() < 0.5
