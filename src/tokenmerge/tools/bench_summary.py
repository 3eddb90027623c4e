"""``python -m tokenmerge.tools.bench_summary docs/bench_X.json[@PX] ...``: one line per model and size from bench
JSON files (``@PX``: that size only) — attention share, ceiling, ToMe's and auto's speed-ups with their ranges, the share of the ceiling auto
recovers — beside the image-transformer targets (at 512 px nothing slower beyond the noise; at 1024 px auto
>= 1 + 0.85 x (ceiling - 1) and ToMe 0.5 >= 1.5x; at 2048 px auto >= 1.6x; video: on Wan at 81 frames auto >= 2.0x; no peak memory above vanilla's)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _speed(row: dict) -> str:
    return f"{row['speedup']:.2f}x ({row['min_s']:.1f}-{row['max_s']:.1f} s)"


def _target(px: int, vanilla: dict, tome: dict, auto: dict, ceiling: float, frames: int | None = None, model: str = "") -> str:
    if frames is not None:  # video: auto >= 2.0x per block at Wan's 480p x 81 frames; no variant above vanilla's memory
        base = max(vanilla["peak_mem_mb"], 1e-9)
        change = ", ".join(f"{name} {r['peak_mem_mb'] / base - 1:+.1%}" for name, r in (("tome", tome), ("auto", auto)))
        memory = f"peak memory against vanilla's: {change}"
        wan81 = model.startswith("wan") and frames >= 81
        return (f"auto >= 2.0x: {'yes' if auto['speedup'] >= 2.0 else 'no'}; " if wan81 else "") + memory
    if px <= 512:
        slower = [r for r in (tome, auto) if r["min_s"] > vanilla["max_s"]]
        return f"nothing slower beyond the noise: {'no' if slower else 'yes'}"
    if px < 2048:
        wanted = 1 + 0.85 * (ceiling - 1)
        return f"auto >= {wanted:.2f}x: {'yes' if auto['speedup'] >= wanted else 'no'}; tome >= 1.5x: {'yes' if tome['speedup'] >= 1.5 else 'no'}"
    return f"auto >= 1.6x: {'yes' if auto['speedup'] >= 1.6 else 'no'}"


def summary(paths: list[str]) -> str:
    lines = [
        "| model (`--blocks`) | px | vanilla s (min-max) | attention share | ceiling | tome 0.5 | auto | auto's share of the ceiling | targets |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for spec in paths:
        path, _, only = spec.partition("@")  # FILE@2048: that size's rows only (a warm-up size left out)
        data = json.loads(Path(path).read_text())
        argv = data["meta"]["argv"]
        model, blocks = argv[argv.index("--model") + 1], argv[argv.index("--blocks") + 1] if "--blocks" in argv else "all"
        sizes: dict[tuple, dict[str, dict]] = {}
        for row in data["rows"]:
            if only and row["size_px"] != int(only):
                continue
            sizes.setdefault((row["size_px"], row.get("width_px"), row.get("frames")), {})[row["variant"]] = row
        for (px, width, frames), rows in sorted(sizes.items(), key=lambda item: (item[0][0], item[0][2] or 0)):
            vanilla = rows["vanilla"]
            share = vanilla.get("attention_share") or 0.0
            ceiling = 1 / (1 - share)
            tome = next(r for name, r in rows.items() if name.startswith("tokenmerge r="))
            auto = rows["tokenmerge auto"]
            recovered = f"{(auto['speedup'] - 1) / (ceiling - 1):.0%}" if (px > 512 or frames) and ceiling > 1 else "-"
            size = f"{px}x{width}, {frames} frames" if frames else str(px)
            lines.append(
                f"| {model} ({blocks}) | {size} | {vanilla['median_s']:.1f} ({vanilla['min_s']:.1f}-{vanilla['max_s']:.1f}) | {share:.0%} | "
                f"{ceiling:.2f}x | {_speed(tome)} | {_speed(auto)} | {recovered} | {_target(px, vanilla, tome, auto, ceiling, frames, model)} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(sys.argv[1:]))
