"""method="todo": self-attention keys/values from a downsampled copy of the tokens, queries at full length."""

from __future__ import annotations

import contextlib

import pytest
import torch

import tokenmerge
from tokenmerge.algorithms import TokenGrid, downsample_tokens, reduce_keys_values
from tokenmerge.integrations.comfyui import TokenMergeNode
from tokenmerge.tools.comfy_models import build_comfy_patcher, comfy_run

from conftest import key_value_counts, ldm_inputs, sd_inputs


def test_diffusers_unet_downsamples_keys_and_values(sd15_small):
    inputs = sd_inputs(sd15_small, 16, 16)
    with torch.no_grad():
        vanilla = sd15_small(**inputs).sample
        tokenmerge.apply_patch(sd15_small, method="todo", kv_factor=1)
        assert torch.equal(sd15_small(**inputs).sample, vanilla)  # factor 1: nothing changes
        tokenmerge.update_options(sd15_small, kv_factor=2)
        with key_value_counts(sd15_small) as seen:
            out = sd15_small(**inputs).sample
        tokenmerge.remove_patch(sd15_small)
        assert torch.equal(sd15_small(**inputs).sample, vanilla)
    assert (256, 64) in seen and (64, 64) in seen  # top level: 16x16 queries, 8x8 keys; level 2 untouched
    rel = ((out - vanilla).norm() / vanilla.norm()).item()
    assert torch.isfinite(out).all() and 1e-4 < rel < 0.5


def test_ldm_unet_downsamples_keys_and_values(ldm_small):
    x, t, context = ldm_inputs(24, 40)
    with torch.no_grad():
        vanilla = ldm_small(x, t, context=context)
        tokenmerge.apply_patch(ldm_small, method="todo", kv_factor=3, kv_interpolation="area")
        with key_value_counts(ldm_small) as seen:
            out = ldm_small(x, t, context=context)
        tokenmerge.remove_patch(ldm_small)
    assert (24 * 40, 8 * 14) in seen  # ceil(24/3) x ceil(40/3)
    assert torch.isfinite(out).all() and not torch.equal(out, vanilla)


def test_comfyui_node_downsamples_keys_and_values():
    patcher = build_comfy_patcher("sd15-small")
    g = torch.Generator().manual_seed(0)
    x, ctx = torch.randn(2, 4, 16, 16, generator=g), torch.randn(2, 7, 32, generator=g)
    (patched,) = TokenMergeNode().patch(patcher, method="todo", kv_factor=2)
    seen = []
    recorder = patched.clone()
    recorder.set_model_attn1_patch(lambda n, c, v, opts: (seen.append((n.shape[1], c.shape[1], v.shape[1])), (n, c, v))[1])
    out = comfy_run(recorder, x, context=ctx)
    assert (256, 64, 64) in seen and torch.isfinite(out).all()
    assert not torch.equal(out, comfy_run(patcher, x, context=ctx))


@pytest.mark.parametrize("h,w,factor", [(16, 16, 2), (15, 9, 2), (7, 5, 3), (4, 4, 1)])
def test_downsample_tokens_shapes(h, w, factor):
    x = torch.randn(2, h * w, 5)
    out = downsample_tokens(x, TokenGrid((h, w)), (factor, factor), "nearest-exact")
    assert out.shape == (2, -(-h // factor) * -(-w // factor), 5)
    if factor == 1:
        assert out is x


@pytest.mark.parametrize("mode", ["nearest-exact", "bilinear", "area"])
def test_grouped_query_keys_are_reduced_in_every_layout_alike(mode):
    """Keys and values with fewer heads than the queries (ComfyUI passes enable_gqa on): 3 text tokens then a 6x4
    image grid, 2 key heads of 5 channels (10 channels: no multiple of a query head count such as 4), reduced alike
    as (B, H, S, D), as (B, S, H, D) and merged as (B, S, H * D); the text keys stay in place."""
    grid, text = TokenGrid((6, 4)), 3
    k, v = torch.randn(2, 2, text + grid.numel, 5), torch.randn(2, 2, text + grid.numel, 5)
    first = reduce_keys_values(k, v, None, text, grid, (2, 2), mode)
    split = reduce_keys_values(k.transpose(1, 2), v.transpose(1, 2), None, text, grid, (2, 2), mode, dim=1)
    merged = reduce_keys_values(k.transpose(1, 2).flatten(2), v.transpose(1, 2).flatten(2), None, text, grid, (2, 2), mode, dim=1)
    for a, b, c in zip(first[:2], split[:2], merged[:2]):
        assert a.shape == (2, 2, text + 6, 5)
        torch.testing.assert_close(b.transpose(1, 2), a)
        torch.testing.assert_close(c, a.transpose(1, 2).flatten(2))
    torch.testing.assert_close(first[0][:, :, :text], k[:, :, :text])


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(method="tomesd"), ValueError, "method must be one of tome, todo"),
        (dict(kv_factor=0), ValueError, "kv_factor must be an int >= 1"),
        (dict(kv_interpolation="linear"), ValueError, "kv_interpolation must be one of nearest-exact"),
    ],
)
def test_todo_options_validate(sd15_small, kwargs, error, match):
    with pytest.raises(error, match=match):
        tokenmerge.apply_patch(sd15_small, **kwargs)


@contextlib.contextmanager
def sdpa_key_counts():
    """(query tokens, key tokens) of every scaled_dot_product_attention call."""
    from torch.overrides import TorchFunctionMode

    sdpa = torch.nn.functional.scaled_dot_product_attention
    seen: list[tuple[int, int]] = []

    class Spy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is sdpa:
                q = args[0] if args else kwargs["query"]
                k = args[1] if len(args) > 1 else kwargs["key"]
                seen.append((q.shape[-2], k.shape[-2]))
            return func(*args, **kwargs)

    with Spy():
        yield seen


@pytest.mark.parametrize("method", ["todo", "auto"])
@pytest.mark.parametrize("fuse_first", [True, False], ids=["fused-then-patched", "patched-then-fused"])
@pytest.mark.parametrize("interpolation", ["nearest-exact", "bilinear"])
def test_fused_qkv_projections_downsample_the_same_keys_and_values(method, fuse_first, interpolation):
    """fuse_qkv_projections() gives self-attention one to_qkv and no to_kv: keys and values are then
    downsampled at the attention call, and equal the unfused result up to float rounding."""
    from tokenmerge.tools.architectures import build_unet

    unet = build_unet("sd15", small=True)
    inputs = sd_inputs(unet, 16, 16)
    options = dict(method=method, kv_factor=2, auto_max_keys=64, auto_min_tokens=64, kv_interpolation=interpolation, max_noise=1)
    with torch.no_grad():
        vanilla = unet(**inputs).sample
        with tokenmerge.patched(unet, **options):
            unfused = unet(**inputs).sample
        if fuse_first:
            unet.fuse_qkv_projections()
            tokenmerge.apply_patch(unet, **options)
        else:
            tokenmerge.apply_patch(unet, **options)
            unet.fuse_qkv_projections()
        with sdpa_key_counts() as seen:
            fused = unet(**inputs).sample
        tokenmerge.remove_patch(unet)
        assert torch.equal(unet(**inputs).sample, unet(**inputs).sample)
    assert (256, 64) in seen  # the top level's 16x16 queries attend to 8x8 keys
    torch.testing.assert_close(fused, unfused, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(fused, vanilla)
