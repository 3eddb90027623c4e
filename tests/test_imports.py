"""The package's import graph, read from the source (every import, function-local ones too; ``TYPE_CHECKING`` blocks
aside): no run-time cycle, and the core never imports the front ends or the tools."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "src" / "tokenmerge"
ON_TOP = ("tokenmerge.integrations", "tokenmerge.tools")  # front ends and tools: on top of the core


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules ``name`` imports when it runs."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)
    }
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_no_module_imports_itself_back_through_others():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert cycles == []


def test_the_core_never_imports_the_front_ends_or_the_tools():
    for name, imported in _graph().items():
        if name == "tokenmerge" or name.startswith(ON_TOP):
            continue
        assert not [m for m in imported if m.startswith(ON_TOP)], name


def test_only_its_module_and_the_registry_name_the_token_cache():
    """The core, the hooks and the front ends carry out block actions and spans without knowing which method made
    them: the newest method's name is written in its own module and in the registry only (the tools, which label
    published results, aside). (The older methods' names are common words, "auto" and "todo", or ToMe's, whose
    merge the algorithms are named for.)"""
    naming = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "tools" not in path.parts and any(w in path.read_text().lower() for w in ("tokencache", "token cache"))
    )
    assert naming == ["methods/__init__.py", "methods/tokencache.py"]
