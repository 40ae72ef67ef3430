"""The composition root: the services and the console do not import each other.

The CLI builds the console and hands the replica a factory for it. Before, the
replica imported ``admin_ui.app`` and the console imported the replica (for its
history types): a 13-module import circle. These tests read every module's
imports from its source (all of them: module level, ``TYPE_CHECKING`` blocks,
inside functions), so a new import that closes the circle again fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("daemon", "admin_ui", "storage", "config")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports (``from a.b import c`` gives a.b and
    a.b.c, since ``c`` may be a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (REPO / package).rglob("*.py")}


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize(
    ("importer", "forbidden"),
    [
        ("daemon.services", "admin_ui"),
        ("daemon.core", "admin_ui"),
        ("daemon.api", "admin_ui"),
        ("daemon.providers", "admin_ui"),
        ("storage", "admin_ui"),
        ("config", "admin_ui"),
        ("admin_ui", "daemon.services.replica"),
        ("admin_ui", "daemon.services.assembly"),
        ("admin_ui", "daemon.cli"),
    ],
)
def test_no_module_of_importer_imports_forbidden(importer: str, forbidden: str) -> None:
    offenders = sorted(
        f"{name} imports {imported}"
        for name, path in modules().items() if _under(name, importer)
        for imported in imports_of(path) if _under(imported, forbidden)
    )
    assert offenders == []


def test_the_cli_is_where_the_console_meets_the_replica() -> None:
    # The walker really sees imports (so the tests above can fail): the CLI imports both.
    cli = imports_of(REPO / "daemon" / "cli.py")
    assert "admin_ui.app" in cli and "daemon.services.replica" in cli


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(component)
    return out


def test_no_import_circle_joins_the_console_and_the_daemon() -> None:
    mods = modules()
    graph = {name: {i for i in imports_of(path) if i in mods and i != name}
             for name, path in mods.items()}
    joined = [sorted(c) for c in _cycles(graph)
              if any(_under(m, "admin_ui") for m in c) and any(_under(m, "daemon") for m in c)]
    assert joined == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert _cycles({"a": {"b"}, "b": set()}) == []
