"""The console script: every layer is reachable, and only the chosen one is imported."""

from __future__ import annotations

import subprocess
import sys

LAYERS = ("llmserve.bench.cli", "llmserve.sim.cli", "llmserve.gateway.cli", "llmserve.serve.serve")


def _imported_after(argv: list[str]) -> set[str]:
    code = ("import sys; from llmserve.cli import build_parser; "
            f"build_parser({argv!r}).parse_args({argv!r}); "
            f"print(','.join(m for m in {LAYERS!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(filter(None, out.strip().split(",")))


def test_engine_start_imports_no_other_layer():
    assert _imported_after(["engine", "--model", "x"]) == set()


def test_a_layer_command_imports_only_its_own_module():
    assert _imported_after(["simulate", "--no-plots"]) == {"llmserve.sim.cli"}


def test_help_lists_every_subcommand():
    out = subprocess.run([sys.executable, "-m", "llmserve.cli", "--help"], capture_output=True, text=True, check=True).stdout
    for name in ("pull", "generate", "chat", "engine", "calibrate", "bench", "simulate", "gateway", "serve"):
        assert name in out
