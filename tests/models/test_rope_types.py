"""A rope scaling type rope.py does not compute (dynamic NTK, or any unknown name) is refused
in one line that names it and the supported ones, by ``llmserve pull`` and ``llmserve engine``
(exit code 2, no traceback), for a HF folder and for a GGUF; a yarn one is taken. And how
llama.cpp's yarn keys read as transformers' terms."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from llmserve.models.families import ROPE_TYPES
from llmserve.models.gguf_loader import _rope_scaling
from llmserve.models.loader import UnsupportedFamily
from llmserve.models.rope_yarn import attention_factor, mscale
from tests.helpers import make_tiny_gguf, make_tiny_llama


def _cli(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmserve.cli", *map(str, argv)], capture_output=True, text=True,
                          timeout=120)


def _with_scaling(folder, scaling):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    (folder / "config.json").write_text(json.dumps({**cfg, "rope_scaling": scaling}))
    return folder


def _refused_in_one_line(r: subprocess.CompletedProcess, kind: str) -> None:
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert f"rope scaling type {kind!r} is not supported" in lines[0]
    assert all(name in lines[0] for name in ROPE_TYPES)


@pytest.mark.parametrize("scaling", [{"rope_type": "dynamic", "factor": 2.0},
                                     {"type": "dynamic", "factor": 2.0},  # the legacy key
                                     {"rope_type": "ntk-by-parts", "factor": 2.0}])
def test_pull_and_engine_refuse_an_unsupported_rope_type(tmp_path, scaling):
    folder = _with_scaling(make_tiny_llama(tmp_path), scaling)
    kind = scaling.get("rope_type") or scaling["type"]
    _refused_in_one_line(_cli("pull", folder), kind)
    _refused_in_one_line(_cli("engine", "--model", folder, "--port", "59873"), kind)


def test_a_gguf_of_an_unsupported_rope_type_is_refused(tmp_path, monkeypatch):
    import gguf

    plain = gguf.GGUFWriter.add_rope_freq_base
    monkeypatch.setattr(gguf.GGUFWriter, "add_rope_freq_base",
                        lambda w, v: (plain(w, v), w.add_string(f"{w.arch}.rope.scaling.type", "dynamic")))
    path = make_tiny_gguf(make_tiny_llama(tmp_path), tmp_path / "dyn.gguf")
    _refused_in_one_line(_cli("pull", path), "dynamic")
    _refused_in_one_line(_cli("engine", "--model", path, "--port", "59874"), "dynamic")


def test_pull_takes_a_yarn_folder(tmp_path):
    folder = _with_scaling(make_tiny_llama(tmp_path), {"rope_type": "yarn", "factor": 4.0,
                                                       "original_max_position_embeddings": 32})
    r = _cli("pull", folder)
    assert r.returncode == 0 and r.stdout.strip() == str(folder.resolve()), r.stderr


def _meta(**keys):
    return {"general.architecture": "qwen3", "qwen3.context_length": 40960,
            **{f"qwen3.rope.scaling.{k}": v for k, v in keys.items()}}


def test_gguf_yarn_keys_read_as_transformers_terms(tmp_path):
    s = _rope_scaling(_meta(type="yarn", factor=4.0, original_context_length=32768, yarn_beta_fast=16.0,
                            yarn_beta_slow=2.0), "qwen3", tmp_path)
    assert s == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                 "beta_fast": 16.0, "beta_slow": 2.0}
    assert attention_factor(s) == pytest.approx(mscale(4.0))
    # no original length: the model's (transformers' fallback); no factor: their ratio
    s = _rope_scaling(_meta(type="yarn", original_context_length=10240), "qwen3", tmp_path)
    assert (s["original_max_position_embeddings"], s["factor"]) == (10240, 4.0)
    assert _rope_scaling(_meta(type="yarn", factor=2.0), "qwen3", tmp_path)["original_max_position_embeddings"] == 40960
    # yarn_attn_factor is the HF config's attention_factor
    s = _rope_scaling(_meta(type="yarn", factor=4.0, yarn_attn_factor=1.3), "qwen3", tmp_path)
    assert attention_factor(s) == pytest.approx(1.3)
    # yarn_log_multiplier is mscale_all_dim, with mscale 1 (llama.cpp's reading)
    s = _rope_scaling(_meta(type="yarn", factor=4.0, yarn_log_multiplier=0.5), "qwen3", tmp_path)
    assert attention_factor(s) == pytest.approx(mscale(4.0) / mscale(4.0, 0.5))
    # attn_factor multiplies whatever the attention factor is (llama.cpp's rope_attn_factor)
    s = _rope_scaling(_meta(type="yarn", factor=4.0, attn_factor=0.5), "qwen3", tmp_path)
    assert attention_factor(s) == pytest.approx(0.5 * mscale(4.0))


def test_gguf_yarn_ext_factor_other_than_the_papers_is_refused(tmp_path):
    assert _rope_scaling(_meta(type="yarn", factor=4.0, yarn_ext_factor=-1.0), "qwen3", tmp_path)  # unset
    assert _rope_scaling(_meta(type="yarn", factor=4.0, yarn_ext_factor=1.0), "qwen3", tmp_path)
    with pytest.raises(UnsupportedFamily, match="yarn_ext_factor 0.5"):
        _rope_scaling(_meta(type="yarn", factor=4.0, yarn_ext_factor=0.5), "qwen3", tmp_path)
