"""The token cache's stores (:mod:`tokenmerge.algorithms.stores`): rows kept as they are, cast, or as int8 with a scale
per group of 64 channels; every written row read back exact, the others within the int8 step of their group."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmerge.algorithms.stores import GROUP, GROUP4, Int8Store, RowStore, store


@settings(max_examples=30, deadline=None)
@given(
    batch=st.integers(1, 3),
    rows=st.integers(1, 40),
    channels=st.sampled_from([8, 16, 24, 64, 96, 128]),
    k=st.integers(1, 8),
    seed=st.integers(0, 2**16),
    outlier=st.booleans(),
)
def test_int8_rows_are_within_half_a_step_of_their_group_and_written_rows_exact(batch, rows, channels, k, seed, outlier):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, rows, channels, generator=g)
    if outlier:  # one outlier channel, as diffusion transformers' activations have: it spoils only its own group
        x[..., 0] *= 1000
    held = Int8Store(x)
    read = held.read(torch.float32)
    group = held.group
    step = x.unflatten(-1, (-1, group)).abs().amax(-1, keepdim=True) / 127  # (its float16 scale: within 2**-11)
    assert ((read - x).unflatten(-1, (-1, group)).abs() <= step * (0.5 + 2**-10) + 1e-6).all()
    if outlier and channels >= 2 * group:
        assert torch.allclose(read[..., group:], x[..., group:], rtol=0.02, atol=0.02)
    k = min(k, rows)
    index = torch.stack([torch.randperm(rows, generator=g)[:k] for _ in range(batch)])
    fresh = torch.randn(batch, k, channels, generator=g)
    at = index[..., None].expand(-1, -1, channels)
    out = held.with_rows(1, at, fresh)
    assert torch.equal(out.gather(1, at), fresh)
    kept = held.read(torch.float32).gather(1, at)
    assert torch.allclose(kept, fresh, atol=float(fresh.abs().max()) / 127)


def test_int8_keeps_a_little_over_half_of_bfloat16s_bytes():
    x = torch.randn(2, 100, 3 * GROUP, dtype=torch.bfloat16)
    held = store(x, "int8")
    assert held.nbytes == x.numel() + x.numel() // GROUP * 2
    assert held.nbytes / (x.numel() * 2) < 0.52


def test_an_exact_store_hands_back_itself_written_in_place():
    x = torch.randn(2, 10, 16)
    held = store(x, None)
    at = torch.tensor([[1], [3]])[..., None].expand(-1, -1, 16)
    out = held.with_rows(1, at, torch.ones(2, 1, 16))
    assert out is held.data and torch.equal(out.gather(1, at), torch.ones(2, 1, 16))
    assert not torch.equal(out, x) and torch.equal(x, x.clone())  # (the caller's tensor was copied, not written)


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_a_cast_store_returns_the_models_dtype_with_its_written_rows_exact(name):
    x = torch.randn(1, 12, 8, dtype=torch.float32)
    held = store(x, name)
    assert held.data.dtype == getattr(torch, name) and held.nbytes == x.numel() * 2
    at = torch.tensor([[2, 5]])[..., None].expand(-1, -1, 8)
    fresh = torch.randn(1, 2, 8)
    out = held.with_rows(1, at, fresh)
    assert out.dtype == torch.float32 and torch.equal(out.gather(1, at), fresh)


def test_keys_kept_as_int8_along_the_sequence_of_heads():
    k = torch.randn(2, 4, 30, 128)  # (B, H, S, D): grouped along the head dimension
    held = store(k, "int8")
    at = torch.tensor([[0, 7], [3, 9]])[:, None, :, None].expand(-1, 4, -1, 128)
    fresh = torch.randn(2, 4, 2, 128)
    out = held.with_rows(2, at, fresh)
    rest = out.clone().scatter_(2, at, k.gather(2, at))  # the rows not written: as stored
    assert torch.equal(out.gather(2, at), fresh) and (rest - k).abs().max() < k.abs().max() / 100


def test_a_store_made_under_inference_mode_is_written_outside_it():
    with torch.inference_mode():
        held = RowStore(torch.randn(1, 4, 8))
        quantised = Int8Store(torch.randn(1, 4, 8))
    at = torch.zeros(1, 1, 8, dtype=torch.long)
    for found in (held, quantised):
        found.thaw()
        found.write(1, at, torch.ones(1, 1, 8))


def test_int4_rows_are_within_half_a_step_and_take_a_quarter_of_bfloat16s_bytes():
    x = torch.randn(2, 30, 256)
    held = store(x, "int4")
    step = x.unflatten(-1, (-1, GROUP4)).abs().amax(-1, keepdim=True) / 7
    assert ((held.read(torch.float32) - x).unflatten(-1, (-1, GROUP4)).abs() <= step * (0.5 + 2**-10) + 1e-6).all()
    assert held.nbytes == x.numel() // 2 + x.numel() // GROUP4 * 2
    at = torch.tensor([[1, 4], [0, 29]])[..., None].expand(-1, -1, 256)
    fresh = torch.randn(2, 2, 256)
    assert torch.equal(held.with_rows(1, at, fresh).gather(1, at), fresh)
    assert torch.allclose(held.read(torch.float32).gather(1, at), fresh, atol=float(fresh.abs().max()) / 7)
