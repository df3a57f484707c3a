"""vLLM's ``min_tokens`` through HTTP on a real ``llmserve engine``: completions and chat,
streamed or not, with ``n``; out of range it is a 400 naming ``min_tokens``."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.helpers import make_tiny_llama
from tests.server.harness import start_engine

EOS = "2"  # <|im_end|>, the tiny model's EOS: a logit bias of 100 makes it the next token whenever allowed
FORCE_EOS = {"logit_bias": {EOS: 100}, "temperature": 0}
CHAT = [{"role": "user", "content": "hi there"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = make_tiny_llama(tmp_path_factory.mktemp("model"), max_position_embeddings=256)
    ep = start_engine(model, tmp_path_factory.mktemp("logs"), "--served-model-name", "tiny", "--max-n", "4")
    yield ep
    ep.stop()


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": "tiny", **body}, timeout=60)


def test_completions_hold_eos_off_until_min_tokens(server):
    body = {"prompt": "hello", "max_tokens": 10, "return_token_ids": True, **FORCE_EOS}
    r = _post(server, "/v1/completions", body).json()
    assert r["usage"]["completion_tokens"] == 1 and r["choices"][0]["finish_reason"] == "stop"
    r = _post(server, "/v1/completions", {**body, "min_tokens": 4, "n": 2, "temperature": 1.0}).json()
    assert r["usage"]["completion_tokens"] == 2 * 5
    for c in r["choices"]:
        ids = c["token_ids"]
        assert c["finish_reason"] == "stop" and len(ids) == 5 and ids[-1] == int(EOS) and int(EOS) not in ids[:-1]


def test_chat_streamed_and_not_hold_eos_off(server):
    body = {"messages": CHAT, "max_tokens": 10, "min_tokens": 3, **FORCE_EOS}
    full = _post(server, "/v1/chat/completions", body).json()
    assert full["usage"]["completion_tokens"] == 4 and full["choices"][0]["finish_reason"] == "stop"
    r = _post(server, "/v1/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == full["choices"][0]["message"]["content"]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]] \
        == ["stop"]
    assert chunks[-1]["usage"]["completion_tokens"] == 4


def test_stop_strings_are_not_applied_to_the_first_min_tokens(server):
    body = {"prompt": "one two", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    base = _post(server, "/v1/completions", body).json()["choices"][0]["text"]
    assert base
    cut = _post(server, "/v1/completions", {**body, "stop": [base[0]]}).json()["choices"][0]
    assert (cut["text"], cut["finish_reason"]) == ("", "stop")
    held = _post(server, "/v1/completions", {**body, "stop": [base[0]], "min_tokens": 12}).json()["choices"][0]
    assert (held["text"], held["finish_reason"]) == (base, "length")


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "x", "max_tokens": 3, "min_tokens": 4}),
    ("/v1/completions", {"prompt": "x", "min_tokens": 17}),  # completions' max_tokens defaults to 16
    ("/v1/completions", {"prompt": "x", "min_tokens": -1}),
    ("/v1/completions", {"prompt": "x", "min_tokens": 1.5}),
    ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 3, "min_tokens": 4}),
    ("/v1/chat/completions", {"messages": CHAT, "min_tokens": -2}),
    ("/v1/chat/completions", {"messages": CHAT, "min_tokens": 300}),  # past the context's end (256)
    ("/v1/chat/completions", {"messages": CHAT, "min_tokens": 300, "stream": True}),
])
def test_out_of_range_is_a_400_naming_min_tokens(server, path, body):
    r = _post(server, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "min_tokens" and err["code"] != "unsupported_parameter", r.text


@pytest.mark.parametrize("stream", [False, True])
def test_a_complete_structured_output_ends_before_min_tokens(server, stream):
    """Once the constraint allows only EOS, the constraint wins (as the answer would end
    without min_tokens): a valid answer and "stop", not a dead-end 400 blaming the grammar."""
    body = {"prompt": "hello", "max_tokens": 8, "min_tokens": 5, "temperature": 0,
            "structured_outputs": {"choice": ["yes", "no"]}, "stream": stream}
    if not stream:
        r = _post(server, "/v1/completions", body)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["text"] in ("yes", "no") and choice["finish_reason"] == "stop"
        return
    text, finish = "", None
    with httpx.stream("POST", server.url + "/v1/completions", json={"model": "tiny", **body}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                assert "error" not in event, event
                text += event["choices"][0]["text"]
                finish = event["choices"][0]["finish_reason"] or finish
    assert text in ("yes", "no") and finish == "stop"
