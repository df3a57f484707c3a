"""``VLLM_API_KEY`` in an engine's environment is an accepted key, as in vLLM (a vLLM user who
exported it got an open server); ``LLMSERVE_API_KEY`` and ``--api-key`` still are."""

from __future__ import annotations

import httpx

from tests.helpers import make_tiny_llama
from tests.server.harness import start_engine


def test_vllm_api_key_from_the_environment_closes_the_server(tmp_path, monkeypatch):
    tiny_path = make_tiny_llama(tmp_path / "model")
    monkeypatch.setenv("VLLM_API_KEY", "from-vllm-env")
    monkeypatch.setenv("LLMSERVE_API_KEY", "from-our-env")
    ep = start_engine(tiny_path, tmp_path, "--api-key", "from-flag")
    try:
        body = {"prompt": "x", "max_tokens": 1}
        assert httpx.post(ep.url + "/v1/completions", json=body, timeout=30).status_code == 401
        for key in ("from-vllm-env", "from-our-env", "from-flag"):
            r = httpx.post(ep.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                           timeout=30)
            assert r.status_code == 200, (key, r.text)
    finally:
        ep.stop()
