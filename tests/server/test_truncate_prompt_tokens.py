"""vLLM's ``truncate_prompt_tokens`` on an engine's completions and chat: the prompt's last N
tokens are kept, and usage counts those; -1 is max_model_len; 0 or over it is a 400."""

from __future__ import annotations

import pytest

from tests.helpers import make_tiny_llama
from tests.server.harness import post, start_engine

CTX = 128


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = make_tiny_llama(tmp_path_factory.mktemp("model"), max_position_embeddings=CTX)
    ep = start_engine(model, tmp_path_factory.mktemp("logs"), "--served-model-name", "tiny")
    yield ep
    ep.stop()


def test_truncate_prompt_tokens_on_completions(server):
    prompt = "one two three four five six seven eight nine ten"
    full = post(server, "/tokenize", {"prompt": prompt}).json()["tokens"]
    assert len(full) > 4
    r = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 2, "truncate_prompt_tokens": 4,
                                         "echo": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 4
    kept = post(server, "/detokenize", {"tokens": full[-4:]}).json()["prompt"]
    assert r.json()["choices"][0]["text"].startswith(kept)
    # token-id prompts, each of several, and -1 (max_model_len: a short prompt is whole)
    r = post(server, "/v1/completions", {"prompt": [full, full[:3]], "max_tokens": 1, "truncate_prompt_tokens": 5})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 5 + 3
    r = post(server, "/v1/completions", {"prompt": full, "max_tokens": 1, "truncate_prompt_tokens": -1})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(full)
    # a prompt over the context fits once truncated
    long = full * (CTX // len(full) + 2)
    assert post(server, "/v1/completions", {"prompt": long, "max_tokens": 1}).status_code == 400
    r = post(server, "/v1/completions", {"prompt": long, "max_tokens": 1, "truncate_prompt_tokens": 10})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 10
    # -1 keeps max_model_len tokens (then no room is left to generate: a 400 counting the kept ones)
    r = post(server, "/v1/completions", {"prompt": long, "max_tokens": 1, "truncate_prompt_tokens": -1})
    assert r.status_code == 400 and f"the prompt has {CTX} tokens" in r.json()["error"]["message"], r.text


def test_truncate_prompt_tokens_on_chat_and_its_bounds(server):
    msgs = [{"role": "user", "content": "tell me a long story about seven dragons"}]
    whole = post(server, "/tokenize", {"messages": msgs}).json()["count"]
    r = post(server, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "truncate_prompt_tokens": 6})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 6 < whole
    r = post(server, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "stream": True,
                                              "stream_options": {"include_usage": True}, "truncate_prompt_tokens": 6})
    assert r.status_code == 200 and '"prompt_tokens":6' in r.text.replace(" ", "")
    for bad in (0, -2, CTX + 1):
        for path, body in (("/v1/chat/completions", {"messages": msgs}), ("/v1/completions", {"prompt": "hi"})):
            r = post(server, path, {**body, "max_tokens": 1, "truncate_prompt_tokens": bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens", (bad, r.text)
