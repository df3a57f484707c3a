"""``llmserve serve`` with a model it cannot find refuses at start, in one line with exit 2
(as ``llmserve engine`` does), instead of starting instances that each fail to load it."""

from __future__ import annotations

import subprocess
import sys

from tests.server.harness import free_port


def _serve(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmserve.cli", "serve", "--port", str(free_port()), *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd)


def test_a_missing_path_or_an_unpulled_model_is_refused_at_start(tmp_path):
    for model, said in ((str(tmp_path / "nowhere.gguf"), "unknown model"),
                        ("SmolLM2-135M-Instruct", "llmserve pull SmolLM2-135M-Instruct"),
                        (str(tmp_path), "is not a model")):
        out = _serve("--model", model, "--model-store", str(tmp_path / "empty-store"), cwd=tmp_path)
        assert out.returncode == 2, (model, out.stdout[-2000:], out.stderr[-2000:])
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("llmserve: error:") and said in lines[0], out.stderr
        assert "pool" not in out.stdout  # nothing was started: serve's banner never printed
