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


def test_the_simulator_does_not_import_the_live_fidelity_harness():
    """``llmserve.sim`` is the pure simulator; only its command line reaches the live
    harness (``llmserve.fidelity``, for ``--fidelity``)."""
    import llmserve
    from tests.import_graph import import_graph

    graph = import_graph(Path(llmserve.__file__).parent, "llmserve")
    sim = {m for m in graph if m.startswith("llmserve.sim.") and m != "llmserve.sim.cli"}
    assert sim and not {d for m in sim for d in graph[m] if d.startswith("llmserve.fidelity")}
    assert not {d for d in graph["llmserve.sim.simulator"] if d.startswith(("llmserve.serve", "llmserve.cli"))}
