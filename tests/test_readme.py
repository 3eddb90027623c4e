"""The documentation as users read it: README.md and the pages under docs/ link to files and headings that exist,
the commands the README shows parse with the real command line, and the README stays short."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from tokenmerge.tools.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The written pages; docs/bench_*.md and docs/eval_*.md are tables the tools generate.
PAGES = [README, *sorted(p for p in (ROOT / "docs").glob("*.md") if not p.name.startswith(("bench_", "eval_")))]
MAX_README_LINES = 260

FENCE = re.compile(r"^(```|~~~)(.*)$")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console", "zsh"}
OPERATORS = {"&&", "||", ";", "|", "&"}


def split_blocks(text: str) -> tuple[str, list[tuple[str, list[str]]]]:
    """The text outside fenced code blocks, and each block as (language, lines)."""
    prose, blocks, block = [], [], None
    for line in text.split("\n"):
        fence = FENCE.match(line.strip())
        if block is None and fence:
            block = (fence.group(2).strip().lower(), [])
        elif block is not None and fence and not fence.group(2).strip():
            blocks.append(block)
            block = None
        elif block is not None:
            block[1].append(line)
        else:
            prose.append(line)
    assert block is None, "unclosed code fence"
    return "\n".join(prose), blocks


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation other than '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    prose, _ = split_blocks(path.read_text())
    seen: dict[str, int] = {}
    found = set()
    for line in prose.split("\n"):
        match = HEADING.match(line)
        if not match:
            continue
        anchor = github_anchor(match.group(2))
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    prose, _ = split_blocks(path.read_text())
    prose = INLINE_CODE.sub("", prose)
    return [t for t in LINK.findall(prose) if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)]  # not http:, mailto:, ...


def test_the_pages_exist_and_docs_pages_link_back_to_the_readme():
    names = {p.name for p in PAGES}
    for page in ("benchmarks", "quality", "archive", "options", "design", "comfyui", "webui", "tests", "families"):
        assert f"{page}.md" in names, f"docs/{page}.md is missing"
    for page in PAGES[1:]:
        assert any(link.startswith("../README.md") for link in relative_links(page)), f"{page.relative_to(ROOT)} does not link back"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    broken = []
    for target in relative_links(page):
        if not target.strip("#"):
            broken.append(f"[...]({target}): an empty target")
            continue
        file_part, _, fragment = target.partition("#")
        resolved = (page.parent / file_part).resolve() if file_part else page
        if not resolved.exists():
            broken.append(f"{target}: no file {resolved}")
        elif fragment and resolved.suffix == ".md" and fragment.lower() not in anchors(resolved):
            broken.append(f"{target}: no heading with anchor #{fragment} in {resolved.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_github_anchor_rule():
    assert github_anchor("Supported models") == "supported-models"
    assert github_anchor("The original `ldm` / `sgm` code") == "the-original-ldm--sgm-code"
    assert github_anchor('"The same results as tomesd"') == "the-same-results-as-tomesd"
    assert github_anchor("UNets: SD 1.5 (tomesd's home ground)") == "unets-sd-15-tomesds-home-ground"
    assert github_anchor("match_dtype and share_plan") == "match_dtype-and-share_plan"


def shell_lines(text: str) -> list[str]:
    """The lines of the shell code blocks, continuation lines joined."""
    _, blocks = split_blocks(text)
    lines = []
    for language, block in blocks:
        if language not in SHELL_BLOCKS:
            continue
        pending = ""
        for line in block:
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            lines.append(pending + line)
            pending = ""
        if pending:
            lines.append(pending)
    return lines


def tokenmerge_commands(line: str) -> list[list[str]]:
    """The argument lists of every `tokenmerge ...` command in a shell line (`.venv/bin/tokenmerge` too)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # an unbalanced quote: prose such as `<this repository's URL>`, not a command to check
        assert not re.search(r"(^|[;&|]\s*)(\S*/)?tokenmerge\s", line), f"cannot parse {line!r}"
        return []
    commands, current = [], []
    for token in [*tokens, ";"]:
        if token in OPERATORS:
            while current and re.match(r"^[A-Za-z_]\w*=", current[0]):  # VAR=value before the command
                current.pop(0)
            if current and Path(current[0]).name == "tokenmerge" and not current[0].endswith("/"):
                commands.append(current[1:])
            current = []
        else:
            current.append(token)
    return commands


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def check_command(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """What is wrong with one `tokenmerge ARGS` line, as messages (none: it parses)."""
    shown = "tokenmerge " + " ".join(args)
    commands = subcommands(parser)
    if not args or args[0] not in commands:
        return [f"{shown}: no subcommand (one of {', '.join(commands)})"]
    options = commands[args[0]]._option_string_actions
    problems = [
        f"{shown}: {flag} is not an option of `tokenmerge {args[0]}`"
        for flag in args[1:]
        if flag.startswith("-") and flag.split("=")[0] not in options and not re.match(r"^-\d", flag)
    ]
    if "-h" in args or "--help" in args:
        return problems
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            _, unknown = parser.parse_known_args(args)
    except SystemExit:
        return [*problems, f"{shown}: {stderr.getvalue().strip().splitlines()[-1]}"]
    return [*problems, *(f"{shown}: unknown argument {u}" for u in unknown)]


def test_tokenmerge_commands_in_readme_code_blocks_parse():
    parser = build_parser()
    commands = [args for line in shell_lines(README.read_text()) for args in tokenmerge_commands(line)]
    assert ["bench"] in commands, "the Quick start's `.venv/bin/tokenmerge bench` was not found"
    assert any(args[:1] == ["eval"] for args in commands)
    problems = [p for args in commands for p in check_command(parser, args)]
    assert not problems, "\n".join(problems)


def test_the_command_check_catches_mistakes():
    parser = build_parser()
    assert tokenmerge_commands("python3 -m venv .venv && .venv/bin/tokenmerge bench --sizes 512 1024  # comment") == [
        ["bench", "--sizes", "512", "1024"]
    ]
    assert tokenmerge_commands("git clone <this repository's URL> ComfyUI/custom_nodes/tokenmerge") == []
    assert tokenmerge_commands("src/tokenmerge/") == []
    (joined,) = shell_lines("```bash\ntokenmerge eval --seeds 8 \\\n  --configs tome:0.5\n```")
    assert joined.split() == ["tokenmerge", "eval", "--seeds", "8", "--configs", "tome:0.5"]
    assert check_command(parser, ["eval", "--seeds", "8", "--configs", "tome:0.5"]) == []
    assert check_command(parser, ["bench", "--sizes", "512", "--no-such-flag"])
    assert check_command(parser, ["bench", "--rep", "2"])  # an abbreviation argparse would accept
    assert check_command(parser, ["eval", "--blocks", "4"])  # a flag of another subcommand
    assert check_command(parser, ["benchmark"])
    assert check_command(parser, ["bench", "--model", "no-such-model"])


def test_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail to a page under docs/ (at most {MAX_README_LINES})"
