"""Per-block cost of ToMe's matching + merge + unmerge next to the block's full self-attention.

Shapes of SD 1.5's top level (320 channels, 8 heads of 40) at 512 and 1024 px, batch 2, ratio 0.5,
fixed destinations (tomesd-equivalent mode). Rows: tomesd 0.1.3's matching (its merge and unmerge
functions applied once each), tokenmerge's exact matching, the same with ``match_dtype=bfloat16``,
and with ``share_plan`` (one matching for the level's 5 blocks, so a fifth per block) — each as ms and
as % of the unpatched attn1 module's time on the same tokens.

    python -m tokenmerge.tools.bench_matching [--threads 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from ..algorithms import TokenGrid, bipartite_soft_matching, grid_partition


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def _row(px: int, attn1: torch.nn.Module, repeats: int, blocks_per_level: int) -> str:
    import tomesd.merge

    h = w = px // 8
    x = torch.randn(2, h * w, 320)
    r = h * w // 2
    src, dst = grid_partition(TokenGrid((h, w)), (2, 2), None, x.device)

    def tomesd_path() -> None:
        merge, unmerge = tomesd.merge.bipartite_soft_matching_random2d(x, w, h, 2, 2, r, no_rand=True)
        unmerge(merge(x))

    def ours(dtype: torch.dtype | None) -> Callable[[], None]:
        def run() -> None:
            plan = bipartite_soft_matching(x, src, dst, r, dtype)
            plan.unmerge(plan.merge(x))

        return run

    plan = bipartite_soft_matching(x, src, dst, r)
    with torch.inference_mode():
        full = median_ms(lambda: attn1(x), max(1, repeats // 2))
        t_tomesd = median_ms(tomesd_path, repeats)
        exact = median_ms(ours(None), repeats)
        bf16 = median_ms(ours(torch.bfloat16), repeats)
        merge_unmerge = median_ms(lambda: plan.unmerge(plan.merge(x)), repeats)
    shared = (exact - merge_unmerge) / blocks_per_level + merge_unmerge

    def cell(ms: float) -> str:
        return f"{ms:.0f} ({100 * ms / full:.1f} %)"

    return f"| {px} | {h * w} | {full:.0f} | {cell(t_tomesd)} | {cell(exact)} | {cell(bf16)} | {cell(shared)} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from diffusers.models.attention_processor import Attention

    torch.manual_seed(0)
    attn1 = Attention(query_dim=320, heads=8, dim_head=40).eval()
    print("| px | tokens | attn1 ms | tomesd ms (%) | exact ms (%) | bfloat16 ms (%) | share_plan ms/block (%) |")
    print("|---|---|---|---|---|---|---|")
    for px in (512, 1024):
        print(_row(px, attn1, args.repeats, blocks_per_level=5), flush=True)  # SD 1.5's top level: 2 down + 3 up blocks
    print(f"\n{torch.get_num_threads()} threads, torch {torch.__version__}, batch 2, ratio 0.5, sx=sy=2, fixed destinations")


if __name__ == "__main__":
    main()
