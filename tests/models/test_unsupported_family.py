"""A model of a family the decoder does not implement is refused at start, in one line that
names the family and the supported ones, for a HF folder and for a GGUF file."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from llmserve.models.families import SUPPORTED_MODEL_TYPES
from llmserve.models.gguf_families import SUPPORTED_ARCHITECTURES
from tests.helpers import make_tiny_gguf, make_tiny_llama


def _start(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmserve.cli", "engine", "--model", str(path), "--port", "59871"],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("kind", ["hf", "gguf"])
def test_unsupported_family_is_refused_in_one_line(tmp_path, kind):
    folder = make_tiny_llama(tmp_path)
    if kind == "hf":
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "falcon"}))
        path, supported = folder, SUPPORTED_MODEL_TYPES
    else:
        path = make_tiny_gguf(folder, tmp_path / "tiny.gguf")
        data = path.read_bytes()
        # the architecture string is written twice (general.architecture and the key prefixes)
        path.write_bytes(data.replace(b"\x05\x00\x00\x00\x00\x00\x00\x00llama", b"\x05\x00\x00\x00\x00\x00\x00\x00falco"))
        path, supported = path, SUPPORTED_ARCHITECTURES
    r = _start(path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "'falco" in lines[0] and "not supported" in lines[0]
    assert all(name in lines[0] for name in supported)


def test_pull_takes_a_local_model_and_refuses_an_unsupported_one(tmp_path):
    folder = make_tiny_llama(tmp_path)
    r = subprocess.run([sys.executable, "-m", "llmserve.cli", "pull", str(folder)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == str(folder.resolve())
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "falcon"}))
    r = subprocess.run([sys.executable, "-m", "llmserve.cli", "pull", str(folder)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "model family 'falcon' is not supported" in r.stderr


def test_pull_refuses_a_local_path_the_engine_could_not_start_from(tmp_path):
    """What ``engine --model`` would refuse, ``pull`` refuses too, in one line: a file that is
    not a GGUF, a folder without its tokenizer."""
    folder = make_tiny_llama(tmp_path)
    (folder / "tokenizer.json").unlink()
    bad = tmp_path / "bad.gguf"
    bad.write_text("garbage\n")
    for path, says in ((bad, "not a GGUF file"), (folder, "no tokenizer.json")):
        r = subprocess.run([sys.executable, "-m", "llmserve.cli", "pull", str(path)], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 2 and r.stdout == "", (path, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], r.stderr


@pytest.mark.parametrize("architecture", ["LlamaForSequenceClassification", "LlamaModel"])
def test_a_supported_family_with_a_head_that_does_not_generate_is_refused(tmp_path, architecture):
    """A reward model or a bare encoder of a supported family (Skywork's reward Llama, an
    embedding Mistral) is not a text generator: one line at start naming its architecture, not
    garbage from tied embeddings or a list of 'missing tensors'."""
    folder = make_tiny_llama(tmp_path, tie_word_embeddings=True)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "architectures": [architecture]}))
    r = _start(folder)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"architecture {architecture!r} is not supported" in lines[0], r.stderr
    (folder / "config.json").write_text(json.dumps({**cfg, "architectures": None}))  # none said: a generator
    from llmserve.models.hf_loader import read_hf_config
    assert read_hf_config(folder).num_hidden_layers == cfg["num_hidden_layers"]
