"""The modules of ``llmserve.engine`` import each other without a cycle, every import
counted: module level, inside functions and under ``TYPE_CHECKING`` alike (a lazy
import only hides a cycle, it does not remove it)."""

from __future__ import annotations

import ast
from pathlib import Path

import llmserve.engine

PACKAGE = "llmserve.engine"


def import_graph(package_dir: Path, package: str) -> dict[str, set[str]]:
    """Module name -> the modules of the same package it imports anywhere in its source."""
    modules = {f.stem for f in package_dir.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name in modules:
        deps: set[str] = set()
        for node in ast.walk(ast.parse((package_dir / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for t in targets:
                head, _, rest = t.partition(f"{package}.")
                if not head and rest.split(".")[0] in modules:
                    deps.add(rest.split(".")[0])
        graph[name] = deps - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state and (c := visit(d)):
                return c
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n)):
            return c
    return None


def _engine_graph() -> dict[str, set[str]]:
    return import_graph(Path(llmserve.engine.__file__).parent, PACKAGE)


def test_the_engine_package_has_no_import_cycle():
    assert find_cycle(_engine_graph()) is None


def test_speculation_does_not_import_the_engine():
    g = _engine_graph()
    for name in ("spec_decode", "draft_model", "proposer", "output_processor"):
        assert "engine" not in g[name], name


def test_a_cycle_through_a_lazy_or_type_checking_import_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import x\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import y\n")
    (pkg / "c.py").write_text("def f():\n    from pkg import a\n")
    (pkg / "d.py").write_text("import pkg.a\n")
    graph = import_graph(pkg, "pkg")
    assert graph["d"] == {"a"} and graph["c"] == {"a"}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    (pkg / "c.py").write_text("import os\n")
    assert find_cycle(import_graph(pkg, "pkg")) is None
