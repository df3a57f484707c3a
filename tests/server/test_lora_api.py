"""vLLM's LoRA API on a live ``llmserve engine``: adapters as models (the merged-weight model's
tokens), ``/v1/models`` with ``parent``, load / unload with the admin key, refusals that name
the problem and leave nothing loaded, residency in ``/load`` and ``/metrics``, and streams on
one adapter unaffected while others are loaded and unloaded."""

from __future__ import annotations

import concurrent.futures as cf
import json

import httpx
import pytest
import torch

from tests.family_models import hf_greedy
from tests.helpers import make_tiny_llama
from tests.lora_adapters import make_adapter
from tests.server.harness import start_engine

KEY = "admin-secret"
PROMPT = [5, 6, 7, 8, 9, 10, 11]
N = 12


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("lora-api")
    folder = make_tiny_llama(root)
    hf = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    merged = {"a": make_adapter(hf, root / "a", 8, ["q_proj", "v_proj", "down_proj"], seed=1),
              "b": make_adapter(hf, root / "b", 4, ["o_proj", "up_proj"], seed=2),
              "big": make_adapter(hf, root / "big", 32, ["q_proj"], seed=3)}
    make_adapter(hf, root / "head", 4, ["lm_head"], seed=4)
    want = {None: hf_greedy(hf, PROMPT, N)[0], **{k: hf_greedy(m, PROMPT, N)[0] for k, m in merged.items()}}
    assert len({tuple(v) for v in want.values()}) == len(want)  # every adapter changes the tokens
    ep = start_engine(folder, root, "--lora-modules", f"a={root / 'a'}", "--max-loras", "2",
                      "--max-lora-rank", "16", "--admin-key", KEY)
    yield ep, root, want
    ep.stop()


def _tokens(url: str, model: str, **kw) -> list[int]:
    body = {"model": model, "prompt": PROMPT, "max_tokens": N, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, **kw}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def _load(url: str, name: str, path, key: str | None = KEY) -> httpx.Response:
    headers = {"x-admin-key": key} if key else {}
    return httpx.post(url + "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)},
                      headers=headers, timeout=60)


def _models(url: str) -> dict[str, dict]:
    return {m["id"]: m for m in httpx.get(url + "/v1/models").json()["data"]}


def test_adapter_as_model_and_listing(served):
    ep, root, want = served
    models = _models(ep.url)
    base = next(k for k, m in models.items() if m["parent"] is None)
    assert models["a"]["parent"] == base and models["a"]["root"] == str(root / "a")
    assert _tokens(ep.url, "a") == want["a"]
    assert _tokens(ep.url, base) == want[None]
    assert httpx.get(ep.url + "/load").json()["lora_adapters"] == ["a"]
    metrics = httpx.get(ep.url + "/metrics").text
    assert 'llmserve:lora_resident{adapter="a",model_name="' in metrics
    r = httpx.post(ep.url + "/v1/completions", json={"model": "nope", "prompt": PROMPT, "max_tokens": 2})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("case", ["missing", "rank", "target", "in_use", "not_adapter", "no_key", "bad_key",
                                  "extra_field"])
def test_refusals_name_the_problem_and_load_nothing(served, case):
    ep, root, _ = served
    before = _models(ep.url)
    if case == "missing":
        r, words = _load(ep.url, "x", root / "nowhere"), "no such adapter"
    elif case == "rank":
        r, words = _load(ep.url, "x", root / "big"), "rank 32 is over the maximum LoRA rank 16"
    elif case == "target":
        r, words = _load(ep.url, "x", root / "head"), "'lm_head'"
    elif case == "in_use":
        r, words = _load(ep.url, "a", root / "b"), "already loaded"
    elif case == "not_adapter":
        (root / "junk").mkdir(exist_ok=True)
        (root / "junk" / "adapter_config.json").write_text("{not json")
        r, words = _load(ep.url, "x", root / "junk"), "cannot read the adapter config"
    elif case == "extra_field":
        r = httpx.post(ep.url + "/v1/load_lora_adapter", headers={"x-admin-key": KEY},
                       json={"lora_name": "x", "lora_path": str(root / "b"), "load_inplace": True})
        words = "load_inplace"
    else:
        r = _load(ep.url, "x", root / "b", key=None if case == "no_key" else "wrong")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_admin_key"
        assert _models(ep.url).keys() == before.keys()
        return
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]
    assert _models(ep.url).keys() == before.keys()


def test_load_serve_unload(served):
    ep, root, want = served
    r = _load(ep.url, "b", root / "b")
    assert r.status_code == 200 and "added successfully" in r.text
    assert _models(ep.url)["b"]["root"] == str(root / "b")
    assert _tokens(ep.url, "b") == want["b"]
    assert "b" in httpx.get(ep.url + "/load").json()["lora_adapters"]
    r = httpx.post(ep.url + "/v1/unload_lora_adapter", json={"lora_name": "b"}, headers={"x-admin-key": KEY})
    assert r.status_code == 200
    assert "b" not in _models(ep.url)
    assert httpx.post(ep.url + "/v1/completions", json={"model": "b", "prompt": PROMPT}).status_code == 404
    r = httpx.post(ep.url + "/v1/unload_lora_adapter", json={"lora_name": "b"}, headers={"x-admin-key": KEY})
    assert r.status_code == 404 and "'b'" in r.json()["error"]["message"]


def _stream(url: str, model: str, n: int) -> list[int]:
    body = {"model": model, "prompt": PROMPT, "max_tokens": n, "temperature": 0, "ignore_eos": True,
            "stream": True, "return_token_ids": True}
    ids: list[int] = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                ids += json.loads(line[6:])["choices"][0].get("token_ids") or []
    return ids


def test_streams_on_other_adapters_unaffected_by_loads_and_unloads(served):
    ep, root, want = served
    base = next(k for k, m in _models(ep.url).items() if m["parent"] is None)
    with cf.ThreadPoolExecutor(6) as pool:
        streams = [pool.submit(_stream, ep.url, m, N) for m in ("a", base, "a", base)]
        for i in range(3):  # while they run: load, serve and unload another adapter
            assert _load(ep.url, f"b{i}", root / "b").status_code == 200
            assert _tokens(ep.url, f"b{i}") == want["b"]
            r = httpx.post(ep.url + "/v1/unload_lora_adapter", json={"lora_name": f"b{i}"},
                           headers={"x-admin-key": KEY})
            assert r.status_code == 200
        got = [s.result() for s in streams]
    assert got == [want["a"], want[None], want["a"], want[None]]


def test_an_adapter_whose_file_went_away_fails_its_request_alone(tmp_path):
    """Evicted from memory, then its folder removed: the request on it gets a 503 JSON
    (adapter_unavailable, the instance's file, not the client's fault) and the name is
    unregistered; the connection, the instance and base-model requests are untouched."""
    import shutil

    from transformers import AutoModelForCausalLM

    folder = make_tiny_llama(tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    for name, seed in (("x", 1), ("y", 2)):
        make_adapter(hf, tmp_path / name, 4, ["q_proj"], seed=seed)
    ep = start_engine(folder, tmp_path, "--enable-lora", "--max-loras", "1", "--max-cpu-loras", "1", "--admin-key", KEY)
    try:
        assert _load(ep.url, "x", tmp_path / "x").status_code == 200
        assert _load(ep.url, "y", tmp_path / "y").status_code == 200
        _tokens(ep.url, "y")  # y takes the one slot; x is out of memory
        assert "x" not in httpx.get(ep.url + "/load").json()["lora_adapters_loaded"]
        assert "x" in httpx.get(ep.url + "/load").json()["lora_adapters_registered"]
        shutil.rmtree(tmp_path / "x")
        r = httpx.post(ep.url + "/v1/completions", json={"model": "x", "prompt": PROMPT, "max_tokens": 2}, timeout=60)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "adapter_unavailable" and "could not be read again" in r.text
        base = next(k for k, m in _models(ep.url).items() if m["parent"] is None)
        assert _tokens(ep.url, base) and _tokens(ep.url, "y")
        r = httpx.post(ep.url + "/v1/completions", json={"model": "x", "prompt": PROMPT, "max_tokens": 2}, timeout=60)
        assert r.status_code == 404 and "x" not in _models(ep.url)
    finally:
        ep.stop()


def test_an_instance_open_to_the_network_loads_adapters_only_with_a_key(tmp_path):
    """No --admin-key and no --api-key on a non-loopback address: load and unload are 403
    (a client could make the instance read any file path); serving is unchanged."""
    folder = make_tiny_llama(tmp_path)
    ep = start_engine(folder, tmp_path, "--enable-lora", "--host", "0.0.0.0")
    try:
        r = _load(ep.url, "x", tmp_path, key=None)
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_key_required", r.text
        r = httpx.post(ep.url + "/v1/unload_lora_adapter", json={"lora_name": "x"}, timeout=30)
        assert r.status_code == 403
        assert httpx.post(ep.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}).status_code == 200
    finally:
        ep.stop()
