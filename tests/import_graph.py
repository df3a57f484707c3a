"""A package's import graph from its source, every import counted: at the top, inside
functions and under ``if TYPE_CHECKING:`` (a type-only cycle is still two modules that
cannot be understood apart). Used by the no-cycle test of the whole of ``llmserve``
(tests/test_import_graph.py) and those of the gateway and the engine."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path


def module_name(path: Path, root: Path, package: str) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """``{module: modules of the package it imports}`` for every ``.py`` under ``root``."""
    files = {module_name(p, root, package): p for p in sorted(root.rglob("*.py"))}
    # a C extension built from one source beside the modules (setup.py) imports none of them
    leaves = {module_name(p, root, package) for p in root.rglob("_*.c")}
    graph: dict[str, set[str]] = {name: set() for name in leaves}
    files.update({name: root for name in leaves if name not in files})
    for name, path in files.items():
        if name in leaves:
            continue
        is_pkg = path.name == "__init__.py"
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's own package upwards
                    up = name.split(".")[: len(name.split(".")) - node.level + is_pkg]
                    base = ".".join([*up, base] if base else up)
                # ``from pkg import mod`` imports the module mod when there is one
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base
                           for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in files:  # ``import pkg.mod.attr`` -> pkg.mod
                    t = t.rpartition(".")[0]
                if t and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as e:
        return e.args[1]
    return None


def assert_acyclic(root: Path, package: str) -> dict[str, set[str]]:
    """The package's import graph, after checking it has no cycle."""
    graph = import_graph(root, package)
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"
    return graph
