"""Prompt-lookup speculation is on by default, counted in /metrics; ``--speculative-config none`` turns it off."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers import make_tiny_llama
from tests.server.harness import start_engine
from tests.server.test_server import metric


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("model"), max_position_embeddings=256)


def _generate(url: str) -> list[int]:
    body = {"model": "tiny", "prompt": [5, 6, 7, 8, 9] * 6, "max_tokens": 80, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def test_speculation_is_on_by_default_and_counted(tiny_path, tmp_path):
    on = start_engine(tiny_path, tmp_path, "--served-model-name", "tiny")
    off = start_engine(tiny_path, tmp_path, "--served-model-name", "tiny", "--speculative-config", "none")
    names = ["vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
             "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total",
             "llmserve:spec_decode_request_acceptance_rate_count", "llmserve:spec_decode_request_acceptance_rate_sum"]
    try:
        before = [metric(on, n) for n in names]  # (the warm-up request may have drafted)
        assert _generate(on.url) == _generate(off.url)  # lossless: greedy token for token
        drafted, accepted, drafts, per_pos, requests, rates = (metric(on, n) - b for n, b in zip(names, before))
        assert drafted > 0 and drafts > 0 and 0 <= accepted <= drafted
        assert per_pos == accepted
        # the request is in the per-request histogram, with its own rate
        assert requests == 1 and rates == pytest.approx(accepted / drafted)
        assert "spec_decode" not in httpx.get(off.url + "/metrics").text
    finally:
        on.stop()
        off.stop()
