"""docs/results/index.md: every generated result (a table, its JSON rows, a plot), grouped by the page that discusses
it, with the table's own first line. ``python -m tokenmerge.tools.results_index`` writes it; tests/test_docs_index.py
keeps it equal to the folder."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

DOCS = Path(__file__).resolve().parents[3] / "docs"
RESULTS = DOCS / "results"
INDEX = RESULTS / "index.md"


def _pages() -> dict[str, str]:
    """The prose pages (docs/*.md, the README) by their link from docs/results/."""
    pages = {f"../{p.name}": p.read_text() for p in sorted(DOCS.glob("*.md"))}
    pages["../../README.md"] = (DOCS.parent / "README.md").read_text()
    return pages


def _pattern(named: str) -> re.Pattern[str]:
    """A results path as a page names it, as a pattern: ``{a,b}`` alternatives and shell variables (``$s``) expanded."""
    text = re.escape(named.rstrip(".,;:"))
    text = re.sub(r"\\\{([^}]*)\\\}", lambda m: "(" + "|".join(m.group(1).split(",")) + ")", text)
    text = re.sub(r"\\\$[A-Za-z_]+", "[^/]+", text)
    return re.compile(text)


def _title(path: Path) -> str:
    """A table's first line of text (not a warning a run printed, a back link or a fence)."""
    for line in path.read_text(errors="ignore").splitlines():
        line = line.strip().strip("`#* ")
        if line and not line.startswith(("[W", "[←", "|", "<", "W1", "/")) and "Warning" not in line:
            return line if len(line) <= 140 else line[:137] + "..."
    return ""


def index() -> str:
    files = sorted(p for p in RESULTS.iterdir() if p.is_file() and p != INDEX)
    stems: dict[str, list[Path]] = defaultdict(list)
    for p in files:
        stems[p.name.split(".")[0]].append(p)
    pages = _pages()
    by_page: dict[str, list[str]] = defaultdict(list)
    patterns = {link: [_pattern(m) for m in re.findall(r"results/([^\s)`'\"]+)", text)] for link, text in pages.items()}
    for stem, group in stems.items():
        names = {p.name for p in group}
        where = [link for link, found in patterns.items() if any(pattern.fullmatch(n) for pattern in found for n in names)]
        by_page[where[0] if where else "(linked from no page)"].append(stem)
    lines = [
        "# Generated results",
        "",
        "[← documentation](../index.md)",
        "",
        "Every table, its JSON rows and plots, written by the command on the page that discusses it (grouped by that page;",
        "the first such page where several link one). Made by `python -m tokenmerge.tools.results_index`.",
    ]
    for page in sorted(by_page):
        lines += ["", f"## [{page.removeprefix('../').removeprefix('../')}]({page})" if page.startswith("..") else f"## {page}", ""]
        for stem in sorted(by_page[page]):
            group = sorted(stems[stem], key=lambda p: (p.suffix != ".md", p.name))
            table = next((p for p in group if p.suffix == ".md"), None)
            title = f": {_title(table)}" if table is not None and _title(table) else ""
            lines.append(f"- {' · '.join(f'[{p.suffix[1:]}]({p.name})' for p in group)} `{stem}`{title}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    INDEX.write_text(index())
    print(f"wrote {INDEX}")
