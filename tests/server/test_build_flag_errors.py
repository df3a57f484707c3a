"""A flag the engine cannot be built with, found only once the model is read (a KV budget
under one block, a --max-model-len the KV pool cannot hold, a missing --lora-modules
adapter, a draft model of another vocabulary, int8 on widths off its group), was a traceback
from the engine process and exit 1 (``llmserve engine``) or a line not naming the flag
(``llmserve generate``); now one line naming the flag, exit 2, as any bad flag."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from llmserve.ports import free_port
from tests.helpers import make_tiny_llama


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {"tiny": make_tiny_llama(root), "draft": make_tiny_llama(root, name="draft", vocab_size=320),
            "odd": make_tiny_llama(root, name="odd", intermediate_size=80)}


CASES = {
    "kv-memory": ("tiny", ["--kv-cache-memory", "1K"], "--kv-cache-memory: 1000 bytes is smaller than one KV block"),
    "kv-blocks": ("tiny", ["--num-kv-blocks", "2", "--max-model-len", "400"],
                  "--max-model-len: 400 does not fit the KV cache"),
    "lora": ("tiny", ["--lora-modules", "a=/nonexistent/adapter"], "--lora-modules: /nonexistent/adapter: no such"),
    "draft": ("tiny", ["--speculative-config", "DRAFT"], "--speculative-config: the draft model's vocab 320 differs"),
    "int8": ("odd", ["--dtype", "int8"], "--dtype: int8 needs the model's layer widths to be multiples of 32"),
}


def _run(command: str, models, case: str) -> subprocess.CompletedProcess:
    model, flags, _ = CASES[case]
    flags = [json.dumps({"method": "draft", "model": str(models["draft"]), "num_speculative_tokens": 2})
             if f == "DRAFT" else f for f in flags]
    tail = ["--port", str(free_port())] if command == "engine" else ["--max-tokens", "1", "hi"]
    return subprocess.run([sys.executable, "-m", "llmserve.cli", command, "--model", str(models[model]), *flags, *tail],
                          capture_output=True, text=True, timeout=120)


def _assert_one_line(proc: subprocess.CompletedProcess, case: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == [lines[0]] and lines[0].startswith(f"llmserve: error: {CASES[case][2]}"), proc.stderr


@pytest.mark.parametrize("case", list(CASES))
def test_llmserve_engine_refuses_the_flag_in_one_line(models, case):
    _assert_one_line(_run("engine", models, case), case)


@pytest.mark.parametrize("case", ["kv-memory", "kv-blocks"])
def test_llmserve_generate_names_the_flag_too(models, case):
    _assert_one_line(_run("generate", models, case), case)
