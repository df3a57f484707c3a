"""``llmserve pull PATH`` checks what it cheaply can (headers against file sizes, the tensors
the config implies), and an engine's load failure says the file's fault in one line."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from llmserve.models.loader import ModelLoadError
from llmserve.models.model_source import check_model, load_tokenizer
from tests.helpers import make_tiny_gguf, make_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("good"))


def _copy(src: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    for f in src.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    return dest


def _edit_config(folder: Path, **fields) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **fields}))


def test_a_good_folder_and_gguf_pass(tiny, tmp_path):
    check_model(tiny)
    check_model(make_tiny_gguf(tiny, tmp_path / "tiny.gguf", "Q8_0"))


def test_a_truncated_safetensors_file_is_refused(tiny, tmp_path):
    bad = _copy(tiny, tmp_path / "trunc")
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[:len(data) // 2])
    with pytest.raises(ModelLoadError, match="model.safetensors: corrupt or truncated safetensors file"):
        check_model(bad)


def test_garbage_in_place_of_a_safetensors_file_is_refused(tiny, tmp_path):
    bad = _copy(tiny, tmp_path / "garbage")
    (bad / "model.safetensors").write_bytes(b"\x00" * 100)
    with pytest.raises(ModelLoadError, match="corrupt or truncated safetensors file"):
        check_model(bad)


def test_a_config_asking_more_layers_than_the_weights_have_is_refused(tiny, tmp_path):
    bad = _copy(tiny, tmp_path / "layers")
    layers = json.loads((tiny / "config.json").read_text())["num_hidden_layers"]
    _edit_config(bad, num_hidden_layers=layers + 1)
    with pytest.raises(ModelLoadError, match=rf"missing tensors \['model\.layers\.{layers}\."):
        check_model(bad)


def test_a_config_whose_intermediate_size_the_weights_disagree_with_is_refused(tiny, tmp_path):
    bad = _copy(tiny, tmp_path / "inter")
    size = json.loads((tiny / "config.json").read_text())["intermediate_size"]
    _edit_config(bad, intermediate_size=size + 8)
    with pytest.raises(ModelLoadError, match=r"tensor model\.layers\.0\.mlp\.gate_proj\.weight has shape "
                                             rf"\({size}, \d+\), config implies \({size + 8}, \d+\)"):
        check_model(bad)


def test_a_tensor_in_two_shards_is_refused(tiny, tmp_path):
    bad = _copy(tiny, tmp_path / "twice")
    weights = load_file(bad / "model.safetensors")
    save_file({"model.norm.weight": torch.ones_like(weights["model.norm.weight"])}, bad / "extra.safetensors")
    with pytest.raises(ModelLoadError, match="model.norm.weight also appears in another shard"):
        check_model(bad)


def test_a_truncated_gguf_is_refused_and_its_tokenizer_says_why(tiny, tmp_path):
    gguf = make_tiny_gguf(tiny, tmp_path / "tiny.gguf", "F32")
    data = gguf.read_bytes()
    bad = tmp_path / "trunc.gguf"
    bad.write_bytes(data[:len(data) * 3 // 4])
    with pytest.raises(ModelLoadError, match="corrupt or truncated GGUF file"):
        check_model(bad)
    # the engine's first read of it is the tokenizer's: the fault, not transformers' reshape error
    with pytest.raises(ModelLoadError, match="trunc.gguf: corrupt or truncated GGUF file"):
        load_tokenizer(bad, tmp_path / "store")


def test_pull_of_a_path_that_does_not_exist_says_so(tmp_path, capsys):
    from llmserve.cli import main

    for name in (str(tmp_path / "nowhere"), "missing.gguf"):
        assert main(["pull", "--model-store", str(tmp_path / "store"), name]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"llmserve: error: {name}: no such file or folder"  # one line, no model list


def test_an_engine_process_that_fails_to_load_says_why(tiny, tmp_path):
    """The child's reason reaches connect. As in ``llmserve engine``, the parent binds its
    sockets only once its event loop runs, after the child may have failed: the child's
    os._exit dropped the unsent reason, and the parent said only "exited during start (1)"."""
    import asyncio

    from llmserve.engine import core_proc
    from llmserve.engine.config import EngineConfig
    from llmserve.engine.llm import build_engine
    from llmserve.engine.multi_process import MultiProcessEngine

    bad = _copy(tiny, tmp_path / "trunc")
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[:len(data) // 2])
    cfg = EngineConfig(model=str(bad), threads=1)
    sys.stderr.flush()
    handle = core_proc.start(lambda: build_engine(cfg), tempfile.mkdtemp(prefix="llmserve-test-"))
    time.sleep(2)  # the build fails meanwhile, before anything listens
    eng = MultiProcessEngine(handle, None)
    try:
        with pytest.raises(ModelLoadError) as e:  # (the model's fault, not a bug: the CLI's exit 2)
            asyncio.run(eng.connect())
    finally:
        eng.shutdown()
    assert str(e.value).startswith(f"{bad}/model.safetensors: corrupt or truncated safetensors file")


@pytest.mark.parametrize("where", ["process", "thread"])
def test_engine_with_a_model_that_fails_to_load_exits_2_in_one_line(tiny, tmp_path, where):
    """Found only by the load (the start's checks pass it): as the CLI's other bad models and
    values, one line and exit code 2, not the engine's failure code 1."""
    import subprocess

    from llmserve.ports import free_port

    bad = _copy(tiny, tmp_path / "trunc")
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[:len(data) // 2])
    argv = [sys.executable, "-m", "llmserve.cli", "engine", "--model", str(bad), "--port", str(free_port()),
            "--no-warmup"]
    r = subprocess.run(argv + (["--engine-in-thread"] if where == "thread" else []), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmserve: error: ") and \
        "model.safetensors: corrupt or truncated safetensors file" in lines[0], r.stderr
