"""The engine's modules import each other without a cycle (every import counted, lazy
and ``TYPE_CHECKING`` ones too: see tests/import_graph.py), and speculation and the
output processor never import the engine they serve."""

from __future__ import annotations

from pathlib import Path

import llmserve.engine
from tests.import_graph import assert_acyclic

ENGINE = Path(llmserve.engine.__file__).parent


def test_the_engine_modules_import_without_a_cycle_and_speculation_not_the_engine():
    graph = assert_acyclic(ENGINE, "llmserve.engine")
    for name in ("spec_decode", "draft_model", "proposer", "output_processor"):
        assert "llmserve.engine.engine" not in graph[f"llmserve.engine.{name}"], name
