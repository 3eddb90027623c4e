"""Token grids of any rank and sequence layouts: property tests of the algorithms on them."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmerge.algorithms import (
    Segment,
    TokenGrid,
    TokenLayout,
    bipartite_soft_matching,
    downsample_keys,
    downsample_tokens,
    grid_partition,
    nearest_indices,
)

shapes = st.lists(st.integers(1, 7), min_size=2, max_size=3).map(tuple)


@settings(max_examples=60, deadline=None)
@given(shape=shapes, data=st.data())
def test_the_partition_covers_every_token_once_with_one_destination_per_window(shape, data):
    grid = TokenGrid(shape)
    window = tuple(data.draw(st.integers(1, 3)) for _ in shape)
    windows = math.prod(s // w for s, w in zip(shape, window))
    offsets = None
    if windows and data.draw(st.booleans()):
        offsets = torch.tensor([data.draw(st.integers(0, math.prod(window) - 1)) for _ in range(windows)])[None]
    src, dst = grid_partition(grid, window, offsets, torch.device("cpu"))
    assert dst.shape[1] == windows and src.shape[1] == grid.numel - windows
    assert sorted(torch.cat([src[0], dst[0]]).tolist()) == list(range(grid.numel))
    # each destination lies in its own window: its coordinates divided by the window are the window's index
    coords = torch.stack(torch.unravel_index(dst[0], shape), -1)
    cells = {tuple((c // torch.tensor(window)).tolist()) for c in coords}
    assert len(cells) == windows


@settings(max_examples=40, deadline=None)
@given(shape=shapes, factor=st.integers(1, 4), batch=st.integers(1, 2))
def test_nearest_downsampling_of_tokens_is_the_selection_downsample_keys_makes(shape, factor, batch):
    grid = TokenGrid(shape)
    factors = grid.spatial(factor, factor)
    x = torch.randn(batch, grid.numel, 3)
    reduced = downsample_tokens(x, grid, factors, "nearest-exact")
    keep = nearest_indices(grid, factors, "nearest-exact", x.device)
    assert reduced.shape[1] == grid.reduced(factors).numel == keep.numel()
    torch.testing.assert_close(reduced, x.index_select(1, keep))
    # the same selection on keys (B, H, S, D) inside a longer sequence: text before and after stays in place
    keys = torch.randn(batch, 2, 4 + grid.numel + 3, 5)
    out = downsample_keys(keys, 4, grid, factors, "nearest-exact")
    assert torch.equal(out[..., :4, :], keys[..., :4, :]) and torch.equal(out[..., -3:, :], keys[..., -3:, :])
    assert torch.equal(out[..., 4:-3, :], keys[..., 4 : 4 + grid.numel, :].index_select(-2, keep))


@settings(max_examples=30, deadline=None)
@given(text=st.integers(0, 5), refs=st.lists(st.integers(1, 4), max_size=2), shape=shapes)
def test_a_merge_keeps_every_other_segment_whole_and_in_place(text, refs, shape):
    grid = TokenGrid(shape)
    layout = TokenLayout.joint(("text", "image", "reference"), grid, text, tuple(refs))
    assert layout.total == text + grid.numel + sum(refs) and layout.image_start == text
    assert layout.stream("image").total == grid.numel + sum(refs) and layout.stream("target").total == grid.numel
    metric = torch.randn(1, grid.numel, 4)
    src, dst = grid_partition(grid, grid.spatial(2, 2), None, metric.device)
    plan = bipartite_soft_matching(metric, src, dst, grid.numel // 2)
    if plan is None:
        return
    rows = layout.kept_rows(plan.keep_idx[0])
    assert rows.numel() == layout.total - (grid.numel - plan.num_kept)
    assert rows[:text].tolist() == list(range(text))
    assert rows[text + plan.num_kept :].tolist() == list(range(text + grid.numel, layout.total))


def test_grids_and_layouts_reject_what_they_cannot_be():
    with pytest.raises(ValueError, match="at least one token"):
        TokenGrid((0, 4))
    with pytest.raises(ValueError, match="kind must be one of"):
        Segment("caption", 3)
    with pytest.raises(ValueError, match="stream must be one of"):
        TokenLayout.image_only(TokenGrid((2, 2))).stream("text")
    assert TokenGrid((4, 6, 8)).axes == ("frames", "height", "width")
    assert TokenGrid((4, 6, 8)).spatial(2, 3) == (1, 3, 2)
    with pytest.raises(ValueError, match="no 3-D form"):
        downsample_tokens(torch.randn(1, 8, 2), TokenGrid((2, 2, 2)), (1, 2, 2), "bicubic")


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 3), ns=st.integers(1, 40), nd=st.integers(1, 12), chunk=st.integers(1, 200), seed=st.integers(0, 2**16))
def test_chunked_similarity_gives_the_dense_best_destinations(b, ns, nd, chunk, seed):
    """Matching a long video's tokens in chunks of sources (bounded memory) picks exactly the dense matmul's best
    destination and score for every source (rows are independent)."""
    from tokenmerge.algorithms import best_destinations

    g = torch.Generator().manual_seed(seed)
    a, d = torch.randn(b, ns, 8, generator=g), torch.randn(b, nd, 8, generator=g)
    dense_max, dense_idx = (a @ d.transpose(-1, -2)).max(dim=-1)
    chunked_max, chunked_idx = best_destinations(a, d, chunk=chunk)
    torch.testing.assert_close(chunked_max, dense_max, rtol=1e-6, atol=1e-6)
    assert torch.equal(chunked_idx, dense_idx) or torch.allclose(
        (a @ d.transpose(-1, -2)).gather(-1, chunked_idx[..., None])[..., 0], dense_max, atol=1e-6
    )  # (equal scores may pick either destination)


def test_matching_a_long_video_never_holds_the_dense_similarity_matrix():
    """33k tokens (Wan 480p x 81 frames): the largest similarity block stays within SIMILARITY_CHUNK elements."""
    from tokenmerge.algorithms import merge

    seen = []

    class Recording(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if getattr(func, "__name__", "") in ("__matmul__", "matmul"):
                seen.append(out.numel())
            return out

    grid = TokenGrid((21, 30, 52))
    src, dst = grid_partition(grid, (1, 2, 2), None, torch.device("cpu"))
    x = torch.randn(1, grid.numel, 16)
    with Recording():
        plan = bipartite_soft_matching(x, src, dst, grid.numel // 2)
    assert plan.num_kept == grid.numel - grid.numel // 2
    assert seen and max(seen) <= merge.SIMILARITY_CHUNK < src.shape[1] * dst.shape[1]
