"""An instance's side of a resumed stream: ``return_token_ids`` on each chunk (the ids
of exactly the text sent), and ``resume_token_ids`` continuing a stream where a
client's copy stopped: no role chunk or echo again, usage counting the whole answer."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.helpers import make_tiny_llama
from tests.server.harness import start_engine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = make_tiny_llama(tmp_path_factory.mktemp("model"))
    ep = start_engine(path, tmp_path_factory.mktemp("logs"), "--served-model-name", "tiny")
    yield ep
    ep.stop()


def stream(server, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", server.url + path, json={"model": "tiny", "stream": True, **body},
                      timeout=60) as r:
        assert r.status_code == 200, r.read()
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def text_of(chunk: dict) -> str:
    c = chunk["choices"][0]
    return c["text"] if "text" in c else c["delta"].get("content") or ""


BODIES = {
    "/v1/completions": {"prompt": "Once upon a time", "echo": True},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Tell me a story"}]},
}
SAMPLING = {"greedy": {"temperature": 0}, "seeded": {"temperature": 1.0, "seed": 99}}


@pytest.mark.parametrize("sampling", list(SAMPLING))
@pytest.mark.parametrize("path", list(BODIES))
def test_a_resumed_stream_continues_the_text_the_client_has(server, path, sampling):
    body = {**BODIES[path], **SAMPLING[sampling], "max_tokens": 48, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    full = stream(server, path, {**body, "return_token_ids": True})
    chunks = [c for c in full if c["choices"]]
    ids = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert len(ids) == 48 and full[-1]["usage"]["completion_tokens"] == 48
    whole = "".join(text_of(c) for c in chunks)
    for cut in (3, len(chunks) // 2, len(chunks) - 2):
        have = chunks[:cut]
        have_ids = [t for c in have for t in c["choices"][0]["token_ids"]]
        rest = stream(server, path, {**body, "return_token_ids": True, "resume_token_ids": have_ids})
        assert rest[-1]["usage"]["completion_tokens"] == 48  # the whole answer, once
        rest = [c for c in rest if c["choices"]]
        assert have_ids + [t for c in rest for t in c["choices"][0]["token_ids"]] == ids
        assert "".join(text_of(c) for c in have + rest) == whole, cut
        assert not any("role" in c["choices"][0].get("delta", {}) for c in rest)
        assert rest[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("extra", [{"stream": False}, {"n": 2}, {"prompt": ["a", "b"]},
                                   {"resume_token_ids": list(range(10, 26))}])
def test_what_cannot_be_resumed_is_refused(server, extra):
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 16, "stream": True, "resume_token_ids": [10, 11],
            **extra}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "resume_token_ids", r.text
