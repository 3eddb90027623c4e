"""What the token cache holds, counted on the shipped Flux-style reference model run in bfloat16 as on a GPU, in units
of batch x image tokens x patched blocks x width x 2 bytes (``tokenmerge.tools.memory.cache_units``): kept exactly it
is 3.5 units (span outputs, keys and values, block inputs); the int8 default at most 2.0, ``memory="low"`` at most 1.0.
The video model's Wan blocks keep one residual each instead of three span outputs. (The quality of each:
docs/tokencache.md#memory, from ``tokenmerge eval`` on both seed sets.)"""

from __future__ import annotations

import warnings

import pytest

from tokenmerge.tools.memory import cache_units

pytest.importorskip("safetensors")


@pytest.mark.parametrize(
    ("kind", "options", "low", "high"),
    [
        ("flux", {"cache_dtype": None}, 3.0, 3.6),
        ("flux", {}, 1.5, 2.0),
        ("flux", {"memory": "low"}, 0.7, 1.0),
        ("video", {}, 1.5, 1.9),  # spans' outputs: 2.86
        ("video", {"memory": "low"}, 0.9, 1.25),  # spans' outputs as int4: 1.47
    ],
)
def test_the_cache_holds_what_its_setting_promises(kind, options, low, high):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = cache_units(kind, **options)
    assert found["batch"] == 2 and found["tokens"] == 1024 and found["blocks"] == (6 if kind == "flux" else 4)
    assert low <= found["units"] <= high, found


def test_the_docs_memory_table_is_what_the_stores_hold():
    """docs/tokencache.md's table (``tokenmerge memory --write-docs``) has a row per model of ``ROWS``, and its Wan 2.1
    1.3B row is what the stores of that model's first block at full width hold now (one residual per block)."""
    from pathlib import Path

    from tokenmerge.tools.memory import ROWS, SETTINGS, published_bytes

    page = (Path(__file__).parents[1] / "docs" / "tokencache.md").read_text()
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in page.splitlines() if line.startswith("| ")}
    assert all(label in rows for label, _, _ in ROWS)
    found = published_bytes("wan")
    cells = rows["Wan 2.1 1.3B"].strip("| ").split(" | ")
    assert cells[-len(SETTINGS) :] == [f"{found[s] / 1e9:.2f} GB" for s in SETTINGS], (cells, found)
