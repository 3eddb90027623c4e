"""docs/ as a reader finds it: every page linked from docs/index.md, every generated result linked from the page that
discusses it and listed in docs/results/index.md (made by tokenmerge.tools.results_index)."""

from __future__ import annotations

import re
from pathlib import Path

from tokenmerge.tools.results_index import INDEX, index

DOCS = Path(__file__).parents[1] / "docs"


def test_every_page_is_linked_from_the_index():
    text = (DOCS / "index.md").read_text()
    linked = set(re.findall(r"\]\(([\w.-]+\.md)", text))
    pages = {p.name for p in DOCS.glob("*.md")} - {"index.md"}
    assert pages <= linked, sorted(pages - linked)


def test_the_results_index_lists_every_result_and_each_is_linked_from_a_page():
    text = index()
    assert INDEX.read_text() == text, "run: python -m tokenmerge.tools.results_index"
    assert "(linked from no page)" not in text
