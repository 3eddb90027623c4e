"""tokenmerge under diffusers' context parallelism: two real ``gloo`` ranks per test (Ulysses, and ring with torch's CPU
flash attention giving the log-sum-exp diffusers' ring merges by), and the per-shard logic checked directly."""

from __future__ import annotations

import math

import pytest
import torch

from tokenmerge.algorithms import TokenGrid, TokenLayout, box_of, chunk_bounds, nearest_indices, shard_layout
from tokenmerge.tools.context_parallel import compare_family, run_ranks

pytest.importorskip("diffusers.models._modeling_parallel")

SPECS = ("todo:2", "auto,auto_min_tokens=64,auto_max_keys=64,max_noise=1", "tome:0.5")
# (family, latent height, width, latent frames): Wan with 4 latent frames, so that each rank holds 2 whole frames.
FAMILIES = [("flux", 32, 32, None), ("flux2", 32, 32, None), ("qwen-image", 32, 32, None), ("wan", 32, 32, 4)]


def _rows(result: dict) -> dict:
    return {(row["spec"], row["patch_first"]): row for row in result["rows"]}


@pytest.fixture(scope="module", params=FAMILIES, ids=[f[0] for f in FAMILIES])
def ulysses(request) -> tuple[str, dict]:
    name, h, w, frames = request.param
    return name, _rows(run_ranks(compare_family, name, h, w, SPECS, frames, (False, True), timeout=300))


def test_vanilla_under_ulysses_is_the_single_process_output(ulysses):
    _, rows = ulysses
    assert rows[("vanilla", False)]["rel_l2_single"] < 1e-5


@pytest.mark.parametrize("patch_first", [False, True], ids=["patched-after", "patched-before"])
@pytest.mark.parametrize("spec", SPECS[:2])
def test_key_value_downsampling_under_ulysses_equals_one_process(ulysses, spec, patch_first):
    # Each rank keeps the keys one process keeps of its part; gathered, they are one process's keys.
    name, rows = ulysses
    row = rows[(spec, patch_first)]
    assert row["rel_l2_single"] < 1e-5, (name, row)
    assert row["rel_l2_vanilla"] > 1e-4  # it acted
    assert row["bytes"] < rows[("vanilla", patch_first)]["bytes"]  # the all-to-all carries fewer keys and values
    assert row["warnings"] == []


@pytest.mark.parametrize("patch_first", [False, True], ids=["patched-after", "patched-before"])
def test_tome_under_ulysses_merges_within_each_rank(ulysses, patch_first):
    _, rows = ulysses
    row = rows[("tome:0.5", patch_first)]
    assert row["rel_l2_vanilla"] > 1e-4 and row["warnings"] == []  # it merged, on every rank (else the all-to-all fails)
    assert row["rel_l2_single"] < 0.2  # within a rank's band, not across: near, not equal to one process's merge
    assert row["bytes"] < rows[("vanilla", patch_first)]["bytes"]


def test_tome_under_ulysses_is_deterministic_across_runs():
    first, second = (_rows(run_ranks(compare_family, "flux", 32, 32, ("tome:0.5",), timeout=300)) for _ in range(2))
    assert torch.equal(first[("tome:0.5", False)]["output"], second[("tome:0.5", False)]["output"])


def test_a_part_that_is_not_a_band_is_refused_clearly_and_runs_unchanged():
    # Wan with 3 latent frames: each rank holds 1.5 frames. ToMe cannot window that: said once, vanilla's output.
    # Key/value downsampling still works there (the whole grid's selection, restricted to each part).
    rows = _rows(run_ranks(compare_family, "wan", 32, 32, ("tome:0.5", "todo:2"), 3, timeout=300))
    tome = rows[("tome:0.5", False)]
    assert tome["rel_l2_vanilla"] == 0
    assert len(tome["warnings"]) == 1 and "not a band of whole rows or frames" in tome["warnings"][0]
    assert rows[("todo:2", False)]["rel_l2_single"] < 1e-5


def test_ulysses_anything_splits_mid_row_and_key_value_downsampling_still_equals_one_process():
    # 15 rows of 16 over 2 ranks: 120 tokens each, the second starting mid-row (diffusers' tensor_split).
    anything = {"ulysses_degree": 2, "ulysses_anything": True}
    rows = _rows(run_ranks(compare_family, "flux", 30, 32, ("todo:2", "tome:0.5"), None, (False,), 0, True, None, anything, timeout=300))
    assert rows[("todo:2", False)]["rel_l2_single"] < 1e-5 and rows[("todo:2", False)]["rel_l2_vanilla"] > 1e-4
    tome = rows[("tome:0.5", False)]
    assert tome["rel_l2_vanilla"] < 1e-5 and "not a band of whole rows or frames" in tome["warnings"][0]


# The token cache over a generation of 5 Euler steps, its 5th cached. Windows of 8 tokens: each rank's part (128 image
# tokens of Flux.1's 256, 512 of Wan's 1024) a whole number of them; windows of 10 (the default): cut by the boundary.
CACHE = "tokencache,full_steps=3,refresh_every=9,recompute=0.125"
CACHE_CUT = "tokencache,full_steps=3,refresh_every=9"
STEPS = 5


def _generation(
    name: str,
    specs: tuple[str, ...],
    frames: int | None = None,
    orders: tuple[bool, ...] = (False,),
    config: dict | None = None,
    engine: str = "diffusers",
    size: tuple[int, int] = (32, 32),
) -> dict:
    """Rank 0's rows of a generation of STEPS calls of ``name`` (a 32x32 latent) under context parallelism."""
    return _rows(run_ranks(compare_family, name, *size, specs, frames, orders, 0, True, None, config, engine, STEPS, timeout=300))


@pytest.fixture(scope="module", params=FAMILIES, ids=[f[0] for f in FAMILIES])
def cached(request) -> tuple[str, dict]:
    name, h, w, frames = request.param
    orders = (False, True) if name in ("flux", "wan") else (False,)
    return name, _generation(name, (CACHE, CACHE_CUT), frames=frames, orders=orders, size=(h, w))


def test_token_cache_under_ulysses_is_one_process_where_the_windows_fit_the_parts(cached):
    # Each rank caches its own tokens' outputs and keys/values and chooses among its own tokens; where its part is a
    # whole number of windows, it chooses what one process chooses, and its cached queries attend to every key.
    name, rows = cached
    for (spec, patch_first), row in rows.items():
        if spec != CACHE:
            continue
        assert row["rel_l2_single"] < 1e-5, (name, patch_first, row["rel_l2_single"])
        assert row["rel_l2_vanilla"] > 1e-4 and row["warnings"] == []  # it acted, nothing said
        vanilla = rows[("vanilla", patch_first)]["step_bytes"]
        assert row["step_bytes"][:-1] == vanilla[:-1]  # full steps exchange what vanilla does
        assert row["step_bytes"][-1] < 0.9 * vanilla[-1]  # the cached step: the recomputed queries and outputs only


def test_token_cache_windows_cut_by_a_rank_boundary_add_tokens_not_change_them(cached):
    # Windows of 10 over parts of 128 or 512 tokens: each rank chooses in the whole grid's windows, so it recomputes
    # every token one process recomputes, and one more per window the boundary cuts (and a top-up to equal counts):
    # the output is as close to vanilla as one process's, or closer, and near it (documented in docs/parallel.md).
    name, rows = cached
    row = rows[(CACHE_CUT, False)]
    assert row["warnings"] == [] and row["rel_l2_vanilla"] > 1e-4
    assert row["rel_l2_vanilla"] <= 1.01 * row["single_vanilla"], name
    assert row["rel_l2_single"] < 0.5 * row["single_vanilla"], (name, row["rel_l2_single"], row["single_vanilla"])


@pytest.mark.parametrize(("name", "frames"), [("flux", None), ("wan", 4)])
def test_ring_attention_runs_key_value_downsampling_and_the_token_cache_as_one_process(name, frames):
    # diffusers' own ring attention (all-gathered keys/values, partial results merged by their log-sum-exp) on
    # two gloo ranks: todo's reduced keys and the token cache's filled keys are each rank's own, of equal length.
    ring = {"ring_degree": 2}
    rows = _generation(name, ("todo:2", CACHE, "tome:0.5"), frames=frames, config=ring)
    assert rows[("vanilla", False)]["rel_l2_single"] < 1e-5
    for spec in ("todo:2", CACHE):
        row = rows[(spec, False)]
        assert row["rel_l2_single"] < 1e-5 and row["rel_l2_vanilla"] > 1e-4 and row["warnings"] == [], (spec, row)
    assert rows[("todo:2", False)]["bytes"] < 0.9 * rows[("vanilla", False)]["bytes"]  # fewer keys go round the ring
    tome = rows[("tome:0.5", False)]
    assert tome["rel_l2_vanilla"] < 1e-5 and any("under ring attention is not supported" in w for w in tome["warnings"])


def test_token_cache_under_ulysses_anything_mid_row():
    # 15 rows of 16 over 2 ranks (the second part starting mid-row): the cache acts on each rank's own tokens.
    anything = {"ulysses_degree": 2, "ulysses_anything": True}
    rows = _generation("flux", (CACHE,), config=anything, size=(30, 32))
    row = rows[(CACHE, False)]
    assert row["rel_l2_single"] < 1e-5 and row["rel_l2_vanilla"] > 1e-4 and row["warnings"] == []


@pytest.mark.parametrize(("name", "frames"), [("flux", None), ("wan", 4)])
def test_cache_dits_own_context_parallel_engine(name, frames):
    # cache-dit splits the sequence with hooks of its own and writes its attention functions over diffusers'
    # registry (Flux.1), or replaces the attention processor with one calling its own dispatcher (Wan); tokenmerge
    # reads its split alike and wraps the functions of both registries, patched before or after.
    pytest.importorskip("cache_dit")
    # A generation of STEPS calls, so that the token cache acts too (per-rank caches, as under diffusers' engine).
    rows = _generation(name, ("todo:2", CACHE, "tome:0.5"), frames=frames, orders=(False, True), engine="cache-dit")
    for patch_first in (False, True):
        assert rows[("vanilla", patch_first)]["rel_l2_single"] < 1e-5
        for spec in ("todo:2", CACHE):
            row = rows[(spec, patch_first)]
            assert row["rel_l2_single"] < 1e-5 and row["rel_l2_vanilla"] > 1e-4 and row["warnings"] == [], (spec, patch_first)
        assert rows[("tome:0.5", patch_first)]["rel_l2_vanilla"] > 1e-4


# ----- the per-shard logic, pure -----


def test_chunk_bounds_follow_torch_chunk_and_tensor_split():
    for total in (7, 8, 30):
        for world in (2, 3, 4):
            x = torch.arange(total)
            assert [(int(c[0]), int(c[-1]) + 1) for c in x.chunk(world) if c.numel()] == [
                b for b in chunk_bounds(total, world) if b[1] > b[0]
            ]
            assert [(int(c[0]), int(c[-1]) + 1) for c in x.tensor_split(world)] == chunk_bounds(total, world, uneven=True)


def test_box_of_finds_bands_of_whole_rows_and_frames():
    grid = TokenGrid((4, 6, 8))
    assert box_of(grid, 0, 2 * 48).shape == (2, 6, 8)  # two frames
    assert box_of(grid, 48 + 3 * 8, 3 * 8).shape == (1, 3, 8)  # three rows of frame 1
    assert box_of(grid, 40, 16) is None  # across a frame boundary
    assert box_of(grid, 4, 8) is None  # half rows


def test_shard_layout_cuts_text_and_image_streams_as_diffusers_does():
    layout = TokenLayout.joint(("text", "image", "reference"), TokenGrid((8, 8)), 6, (TokenGrid((4, 4)),))
    rank0 = shard_layout(layout, 0, 2, text_split=True)
    rank1 = shard_layout(layout, 1, 2, text_split=True)
    # image stream: 64 + 16 = 80 tokens, 40 per rank: rank 0 = rows 0-4, rank 1 = rows 5-7 and the reference.
    assert [(s.kind, s.length) for s in rank0.segments] == [("text", 3), ("image", 40)]
    assert rank0.grid.shape == (5, 8) and rank0.shard.start == 0 and rank0.shard.box.shape == (5, 8)
    assert [(s.kind, s.length) for s in rank1.segments] == [("text", 3), ("image", 24), ("reference", 16)]
    assert rank1.shard.start == 40 and rank1.grid.shape == (3, 8)
    assert shard_layout(layout, 0, 2, text_split=False).text_tokens == 6
    assert "equal chunks" in shard_layout(TokenLayout.joint(("text", "image"), TokenGrid((8, 8)), 5), 0, 2, text_split=True)


def test_each_rank_keeps_the_single_process_keys_of_its_part():
    grid = TokenGrid((8, 10, 12))  # 4 frames per rank: whole windows of the temporal factor 2
    whole = nearest_indices(grid, (2, 2, 2), "nearest-exact", torch.device("cpu"))
    layout = TokenLayout.image_only(grid)
    parts = [shard_layout(layout, r, 2, text_split=False) for r in range(2)]
    kept = [p.shard.kept((2, 2, 2), "nearest-exact", torch.device("cpu")) for p in parts]
    gathered = torch.cat([keep + p.shard.start for (keep, _), p in zip(kept, parts)])
    assert torch.equal(gathered.sort().values, whole.sort().values)
    assert kept[0][1] == kept[1][1] == [whole.numel() // 2] * 2


def test_unequal_shares_are_topped_up_to_equal_lengths():
    # 15 frames over 2 ranks (8 + 7, the second starting mid-window): the ranks' shares of the kept frames differ.
    grid = TokenGrid((15, 4, 4))
    parts = [shard_layout(TokenLayout.image_only(grid), r, 2, text_split=False, uneven=True) for r in range(2)]
    kept = [p.shard.kept((2, 1, 1), "nearest", torch.device("cpu")) for p in parts]
    counts = kept[0][1]
    assert counts[0] != counts[1]
    assert kept[0][0].numel() == kept[1][0].numel() == max(counts)
    for (keep, _), p in zip(kept, parts):
        assert keep.unique().numel() == keep.numel() and int(keep.max()) < p.shard.length


def test_each_rank_chooses_what_one_process_chooses_in_its_part_plus_the_cut_windows():
    from tokenmerge.methods.tokencache import select

    torch.manual_seed(0)
    for total, world, window, uneven in ((256, 2, 10, False), (240, 2, 8, True), (300, 3, 7, False), (225, 2, 10, True)):
        grid = TokenGrid((total,), ("tokens",))
        change = torch.rand(2, total)
        whole = select(change, window)
        parts = [shard_layout(TokenLayout.image_only(grid), r, world, text_split=False, uneven=uneven).shard for r in range(world)]
        chosen = [select(change[:, p.start : p.start + p.length], window, *p.windows(window)) + p.start for p in parts]
        assert len({c.shape[1] for c in chosen}) == 1  # the same count on every rank
        for sample in range(2):
            mine = set(torch.cat([c[sample] for c in chosen]).tolist())
            assert set(whole[sample].tolist()) <= mine  # every token one process recomputes
            assert len(mine) == sum(c.shape[1] for c in chosen)  # each once
            assert all(c[sample].tolist() == sorted(c[sample].tolist()) for c in chosen)
        cut = sum(1 for p in parts[1:] if p.start % window)
        assert sum(c.shape[1] for c in chosen) - whole.shape[1] <= cut + world - 1  # the cut windows, the top-ups


def test_ring_attention_over_reduced_shards_equals_attention_over_one_process_keys():
    """A ring step attends to one rank's keys/values at a time and merges the partial results by their log-sum-exp;
    over each rank's reduced keys/values it gives the attention over one process's reduced keys, and each step
    sends only the reduced keys/values (the bytes below)."""
    torch.manual_seed(0)
    grid, world, heads, dim = TokenGrid((8, 8)), 2, 2, 16
    layout = TokenLayout.joint(("text", "image"), grid, 4)
    q, k, v = (torch.randn(1, heads, layout.total, dim) for _ in range(3))
    keep = nearest_indices(grid, (2, 2), "nearest-exact", q.device)
    columns = layout.kept_rows(keep)
    reference = torch.nn.functional.scaled_dot_product_attention(q, k[:, :, columns], v[:, :, columns])

    def part(x: torch.Tensor, rank: int) -> torch.Tensor:  # [text chunk; image chunk] as diffusers splits it
        text, image = x[:, :, :4].chunk(world, 2)[rank], x[:, :, 4:].chunk(world, 2)[rank]
        return torch.cat([text, image], 2)

    shards = [shard_layout(layout, r, world, text_split=True) for r in range(world)]
    reduced = []
    for r, shard in enumerate(shards):
        rows = shard.kept_rows(shard.shard.kept((2, 2), "nearest-exact", q.device)[0])
        reduced.append((part(k, r)[:, :, rows], part(v, r)[:, :, rows]))
    sent = sum(kr.numel() + vr.numel() for kr, vr in reduced) * 4
    full = sum(part(k, r).numel() + part(v, r).numel() for r in range(world)) * 4
    assert sent < full * 0.3  # a quarter of the image keys, all the text
    for r in range(world):
        qr = part(q, r)
        out, lse = None, None
        for kr, vr in reduced:  # the ring: one rank's keys/values per step
            scores = qr @ kr.transpose(-1, -2) / math.sqrt(dim)
            step_lse = scores.logsumexp(-1, keepdim=True)
            step = (scores - step_lse).softmax(-1) @ vr
            if out is None:
                out, lse = step, step_lse
            else:
                new = torch.logaddexp(lse, step_lse)
                out = out * (lse - new).exp() + step * (step_lse - new).exp()
                lse = new
        torch.testing.assert_close(out, part(reference, r), atol=1e-5, rtol=1e-5)
