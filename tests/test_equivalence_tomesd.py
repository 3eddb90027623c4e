"""With use_rand=False tokenmerge computes what tomesd 0.1.3 computes.

"The same" is defined where tomesd itself is defined. On the same tokens both choose the same merge (the
same partition, pairs and layout) wherever the choice is not a near-tie of similarity scores; near-ties
(scores equal up to float rounding) are resolved by the order of float operations, so tomesd's own results
differ between CPUs there, and a tie resolved differently in one block changes everything after it. So:

- the matching is compared on the same tokens, with inputs whose decisions are tie-free (checked in
  float64, so the check itself does not depend on the machine): the same groups of tokens are merged (the
  order of the merged sequence may differ: tomesd orders destinations with an unstable sort, which differs
  between machines, and nothing downstream depends on that order); and on tokens with exact ties, where both
  merges must be valid for the rule (tie-equivalent);
- whole UNets are compared with tomesd's merges replayed in tokenmerge's hooks (teacher forcing): given the
  same merges, every block, flag and grid gives the same output to 1e-5 of its scale.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import tomesd
import tomesd.merge
import torch
from hypothesis import assume, given, settings

import tokenmerge
import tokenmerge.methods.tome
from tokenmerge.algorithms import MergePlan, TokenGrid, bipartite_soft_matching, grid_partition
from tokenmerge.tools.architectures import build_unet

from conftest import LDM_SD15, build_ldm_unet, ldm_inputs, max_rel_diff, sd_inputs

TOLERANCE = 1e-5
FLAGS = [(False, False), (True, False), (False, True), (True, True)]  # merge_crossattn, merge_mlp
TIE_GAP = 1e-4  # decisions closer than this (cosine similarity, float64) count as ties


def _closure(fn) -> dict:
    """The free variables of a closure, with those of the closures it calls (tomesd's merge -> split)."""
    found = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
    for value in list(found.values()):
        if callable(value) and getattr(value, "__closure__", None):
            found.update({k: v for k, v in _closure(value).items() if k not in found})
    return found


def tomesd_plan(merge_fn, batch: int, n: int) -> MergePlan | None:
    """tomesd's merge decisions (its merge closure's index tensors) as a tokenmerge MergePlan."""
    if merge_fn is tomesd.merge.do_nothing:
        return None
    v = _closure(merge_fn)
    a_pos, b_pos = v["a_idx"][..., 0].expand(batch, -1), v["b_idx"][..., 0].expand(batch, -1)
    unm, src, dst = v["unm_idx"][..., 0], v["src_idx"][..., 0], v["dst_idx"][..., 0]
    keep_idx = torch.cat([a_pos.gather(1, unm), b_pos], dim=1)
    src_pos = a_pos.gather(1, src)
    dst_slot = dst + unm.shape[1]
    counts = torch.ones(batch, keep_idx.shape[1]).scatter_add_(1, dst_slot, torch.ones_like(dst_slot, dtype=torch.float32))
    unmerge = torch.empty(batch, n, dtype=torch.int64)
    unmerge.scatter_(1, keep_idx, torch.arange(keep_idx.shape[1]).expand(batch, -1))
    unmerge.scatter_(1, src_pos, dst_slot)
    return MergePlan(keep_idx, src_pos, dst_slot, counts[..., None], unmerge)


def _representatives(plan: MergePlan) -> torch.Tensor:
    """For every token position, the kept position whose merged slot holds its value."""
    return plan.keep_idx.gather(1, plan.unmerge_idx)


def _decision_gaps(metric: torch.Tensor, h: int, w: int, sx: int, sy: int, r: int) -> float:
    """The smallest gap, in float64, between a choice the matching makes and its runner-up."""
    m = metric.double() / metric.double().norm(dim=-1, keepdim=True)
    src, dst = grid_partition(TokenGrid((h, w)), (sy, sx), None, metric.device)
    scores = m[:, src[0]] @ m[:, dst[0]].transpose(-1, -2)
    gaps = [float("inf")]
    if scores.shape[-1] > 1:
        top2 = scores.topk(2, dim=-1).values
        gaps.append((top2[..., 0] - top2[..., 1]).min().item())
    best = scores.max(-1).values.sort(-1, descending=True).values
    r = min(r, best.shape[-1])
    if 0 < r < best.shape[-1]:
        gaps.append((best[:, r - 1] - best[:, r]).min().item())
    return min(gaps)


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 3),
    h=st.integers(2, 12),
    w=st.integers(2, 12),
    sx=st.integers(1, 3),
    sy=st.integers(1, 3),
    ratio=st.floats(0.05, 0.9),
    seed=st.integers(0, 10_000),
)
def test_the_same_tokens_give_tomesds_merge_where_there_are_no_ties(b, h, w, sx, sy, ratio, seed):
    assume(h >= sy and w >= sx and sx * sy > 1)
    metric = torch.randn(b, h * w, 16, generator=torch.Generator().manual_seed(seed))
    r = int(h * w * ratio)
    assume(_decision_gaps(metric, h, w, sx, sy, r) > TIE_GAP)
    m, u = tomesd.merge.bipartite_soft_matching_random2d(metric, w, h, sx, sy, r, no_rand=True)
    reference = tomesd_plan(m, b, h * w)
    src, dst = grid_partition(TokenGrid((h, w)), (sy, sx), None, metric.device)
    ours = bipartite_soft_matching(metric, src, dst, r)
    if reference is None:
        assert ours is None
        return
    # The same groups: every position is represented by the same kept position. (The order of the merged
    # sequence may differ: tomesd orders destinations with an unstable sort, which differs between machines;
    # attention and MLPs do not depend on that order.)
    assert torch.equal(_representatives(ours), _representatives(reference))
    assert ours.num_kept == reference.num_kept
    x = torch.randn(b, h * w, 8, generator=torch.Generator().manual_seed(seed + 1))
    torch.testing.assert_close(ours.unmerge(ours.merge(x)), u(m(x)), rtol=1e-6, atol=1e-6)


def _valid_for_the_rule(plan: MergePlan, metric: torch.Tensor, h: int, w: int, sx: int, sy: int) -> bool:
    """Each merged source sits in a best-scoring destination, and no unmerged source scores better than a merged one."""
    m = metric.double() / metric.double().norm(dim=-1, keepdim=True)
    _, dst = grid_partition(TokenGrid((h, w)), (sy, sx), None, metric.device)
    scores = m @ m[:, dst[0]].transpose(-1, -2)  # every position against the destinations
    best = scores.max(-1).values
    dst_of_slot = plan.keep_idx.gather(1, plan.dst_slot)  # position of each merged source's destination
    chosen = scores.gather(1, plan.src_idx[..., None].expand(-1, -1, scores.shape[-1])).gather(
        2, (dst_of_slot[..., None] == dst[0]).float().argmax(-1, keepdim=True)
    )[..., 0]
    pos_dst = set(dst[0].tolist())
    unmerged = [[p for p in row if p not in pos_dst] for row in plan.keep_idx.tolist()]
    ok = torch.allclose(chosen, best.gather(1, plan.src_idx), atol=1e-6)
    for row, rest in enumerate(unmerged):
        if rest and plan.src_idx.shape[1]:
            ok &= best[row, rest].max().item() <= best[row, plan.src_idx[row]].min().item() + 1e-6
    return bool(ok)


@pytest.mark.parametrize("h,w,ratio", [(4, 4, 0.5), (6, 5, 0.3), (8, 8, 0.75)])
def test_exact_ties_give_tie_equivalent_merges(h, w, ratio):
    """Repeated tokens make many exact ties: any tie-break is valid, and both libraries' are."""
    g = torch.Generator().manual_seed(0)
    palette = torch.randn(3, 16, generator=g)
    metric = palette[torch.randint(3, (2, h * w), generator=g)]
    r = int(h * w * ratio)
    m, _ = tomesd.merge.bipartite_soft_matching_random2d(metric, w, h, 2, 2, r, no_rand=True)
    src, dst = grid_partition(TokenGrid((h, w)), (2, 2), None, metric.device)
    ours = bipartite_soft_matching(metric, src, dst, r)
    assert _valid_for_the_rule(ours, metric, h, w, 2, 2)
    assert _valid_for_the_rule(tomesd_plan(m, 2, h * w), metric, h, w, 2, 2)


@pytest.fixture
def replayed_tomesd_merges(monkeypatch):
    """Record tomesd's merges; tokenmerge's hooks then replay them in the same order instead of matching."""
    recorded: list[MergePlan | None] = []
    real = tomesd.merge.bipartite_soft_matching_random2d

    def recording(metric, w, h, sx, sy, r, no_rand=False, generator=None):
        m, u = real(metric, w, h, sx, sy, r, no_rand, generator)
        recorded.append(tomesd_plan(m, metric.shape[0], metric.shape[1]))
        return m, u

    monkeypatch.setattr(tomesd.merge, "bipartite_soft_matching_random2d", recording)
    replay = iter(())

    def replaying(x, h, w, *args, **kwargs):
        return next(replay)

    monkeypatch.setattr(tokenmerge.methods.tome, "plan_merge", replaying)

    def start_replay():
        nonlocal replay
        replay = iter(list(recorded))

    return recorded, start_replay


def _compare(patch_target, run, replay, ratio, merge_crossattn, merge_mlp, max_downsample=1) -> tuple[float, float]:
    """(max relative diff of tokenmerge replaying tomesd's merges to tomesd, of tomesd to vanilla)."""
    recorded, start_replay = replay
    options = dict(ratio=ratio, use_rand=False, merge_crossattn=merge_crossattn, merge_mlp=merge_mlp, max_downsample=max_downsample)
    with torch.no_grad():
        vanilla = run()
        tomesd.apply_patch(patch_target, **options)
        reference = run()
        tomesd.remove_patch(patch_target)
        start_replay()
        with tokenmerge.patched(patch_target, **options):
            ours = run()
    assert recorded and any(p is not None for p in recorded)
    return max_rel_diff(ours, reference), max_rel_diff(reference, vanilla)


def _diffusers_run(unet, h, w, batch=2):
    inputs = sd_inputs(unet, h, w, batch=batch)
    # tomesd reads the latent size from the first positional argument.
    args = (inputs["sample"], inputs["timestep"], inputs["encoder_hidden_states"])
    return lambda: unet(*args).sample


def _ldm_run(unet, h, w, context_dim=32, batch=2):
    x, t, context = ldm_inputs(h, w, batch=batch, context_dim=context_dim)
    return lambda: unet(x, t, context=context)


def _webui_object_for(unet):
    holder = torch.nn.Module()
    holder.model = torch.nn.Module()
    holder.model.diffusion_model = unet
    return holder


@pytest.mark.parametrize("max_downsample", [1, 8])
@pytest.mark.parametrize("size", [(32, 32), (33, 49), (35, 23)])
@pytest.mark.parametrize("ratio", [0.3, 0.75])
@pytest.mark.parametrize("merge_crossattn,merge_mlp", FLAGS)
def test_diffusers_unet_gives_tomesds_output_for_tomesds_merges(
    sd15_small, replayed_tomesd_merges, size, ratio, merge_crossattn, merge_mlp, max_downsample
):
    run = _diffusers_run(sd15_small, *size)
    diff, effect = _compare(sd15_small, run, replayed_tomesd_merges, ratio, merge_crossattn, merge_mlp, max_downsample)
    assert diff <= TOLERANCE
    assert effect > 1e-3  # the comparison is not trivial: merging changed the output


# ldm's UNet itself needs latent sides divisible by 8; 24 and 56 give odd token grids (3, 7) at level 8.
@pytest.mark.parametrize("max_downsample", [1, 8])
@pytest.mark.parametrize("size", [(32, 32), (40, 24), (24, 56)])
@pytest.mark.parametrize("ratio", [0.3, 0.75])
@pytest.mark.parametrize("merge_crossattn,merge_mlp", FLAGS)
def test_ldm_unet_gives_tomesds_output_for_tomesds_merges(
    ldm_small, replayed_tomesd_merges, size, ratio, merge_crossattn, merge_mlp, max_downsample
):
    # tomesd needs the webui's object; tokenmerge accepts it too, so both patch the same wrapper.
    target, run = _webui_object_for(ldm_small), _ldm_run(ldm_small, *size)
    diff, effect = _compare(target, run, replayed_tomesd_merges, ratio, merge_crossattn, merge_mlp, max_downsample)
    assert diff <= TOLERANCE
    assert effect > 1e-3


@pytest.fixture(scope="module")
def sd15_full():
    return build_unet("sd15")


@pytest.fixture(scope="module")
def ldm_sd15_full():
    return build_ldm_unet(small=False)


@pytest.mark.slow
@pytest.mark.parametrize("size,merge_crossattn,merge_mlp", [((64, 64), False, False), ((64, 64), True, True), ((65, 97), False, False)])
def test_sd15_architecture_gives_tomesds_output(sd15_full, replayed_tomesd_merges, size, merge_crossattn, merge_mlp):
    diff, effect = _compare(sd15_full, _diffusers_run(sd15_full, *size, batch=1), replayed_tomesd_merges, 0.5, merge_crossattn, merge_mlp)
    assert diff <= TOLERANCE
    assert effect > 1e-4


@pytest.mark.slow
def test_ldm_sd15_architecture_gives_tomesds_output(ldm_sd15_full, replayed_tomesd_merges):
    run = _ldm_run(ldm_sd15_full, 64, 64, context_dim=LDM_SD15["context_dim"], batch=1)
    diff, effect = _compare(_webui_object_for(ldm_sd15_full), run, replayed_tomesd_merges, 0.5, False, False)
    assert diff <= TOLERANCE
    assert effect > 1e-4
