"""The import-graph checker (tests/import_graph.py) finds the cycles it is there to find."""

from __future__ import annotations

from pathlib import Path

from tests.import_graph import find_cycle, import_graph


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


def test_no_module_of_llmserve_imports_in_a_circle():
    """The whole tree at once, so a cycle between two packages counts too, and every
    package (every folder with an ``__init__.py``) is in the graph checked."""
    import llmserve
    from tests.import_graph import assert_acyclic

    root = Path(llmserve.__file__).parent
    graph = assert_acyclic(root, "llmserve")
    packages = {".".join(["llmserve", *p.parent.relative_to(root).parts]) for p in root.rglob("__init__.py")}
    assert len(packages) > 5 and packages <= set(graph)
    assert all(any(m.startswith(f"{pkg}.") for m in graph) for pkg in packages)  # their modules too
