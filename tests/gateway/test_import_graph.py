"""The gateway's modules import each other without a cycle, counting every import: at
the top, inside functions and under ``if TYPE_CHECKING:`` (a type-only cycle is still
two modules that cannot be understood apart). The runtime imports no HTTP framework."""

from __future__ import annotations

import ast
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import llmserve.gateway

GATEWAY = Path(llmserve.gateway.__file__).parent


def module_name(path: Path, root: Path, package: str) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """``{module: modules of the package it imports}`` for every ``.py`` under ``root``."""
    files = {module_name(p, root, package): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
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


def test_the_gateway_modules_import_without_a_cycle():
    graph = import_graph(GATEWAY, "llmserve.gateway")
    assert "llmserve.gateway.runtime" in graph and "llmserve.gateway.balancer.picker" in graph
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_checker_sees_a_cycle_through_type_checking_and_relative_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import C\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    import pkg.a\n")
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.a"}
    assert set(find_cycle(graph)) == {"pkg.a", "pkg.sub.b", "pkg.c"}
    (pkg / "c.py").write_text("import typing\n")
    assert find_cycle(import_graph(pkg, "pkg")) is None


def test_the_runtime_loads_no_http_framework():
    """The gateway's runtime (pools, router, canary, monitor) runs without FastAPI or
    Starlette: only ``app`` and the request path speak HTTP."""
    code = ("import sys\nimport llmserve.gateway.runtime\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('fastapi', 'starlette'))\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
