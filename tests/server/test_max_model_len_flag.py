"""``llmserve engine --max-model-len N`` past the model's context was a traceback from the
engine process and exit 1; it is refused before the load in one line naming the flag and
the model's limit, exit 2, as a bad flag is (vLLM refuses it too)."""

from __future__ import annotations

import subprocess
import sys

from llmserve.ports import free_port
from tests.helpers import make_tiny_llama


def test_a_max_model_len_past_the_models_context_is_one_line_and_exit_2(tmp_path):
    tiny = make_tiny_llama(tmp_path)  # max_position_embeddings 512
    proc = subprocess.run([sys.executable, "-m", "llmserve.cli", "engine", "--model", str(tiny), "--port", str(free_port()),
                           "--max-model-len", "100000"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    # the engine's own words for it (test_max_model_len.py), not a second wording
    assert "--max-model-len: 100000 is longer than the model's context (512 tokens)" in proc.stderr
