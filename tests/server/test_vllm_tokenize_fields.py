"""vLLM's ``/tokenize`` fields on an engine: ``return_token_strs`` (the answer's ``token_strs``)
and, with ``messages``, ``continue_final_message`` (vLLM's TokenizeChatRequest / TokenizeResponse)."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers import make_tiny_llama
from tests.server.harness import start_engine

CTX = 128


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = make_tiny_llama(tmp_path_factory.mktemp("model"), max_position_embeddings=CTX)
    ep = start_engine(model, tmp_path_factory.mktemp("logs"), "--served-model-name", "tiny")
    yield ep
    ep.stop()


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def test_tokenize_returns_token_strs_as_vllm(server):
    plain = post(server, "/tokenize", {"prompt": "hello world"})
    assert plain.status_code == 200 and plain.json()["token_strs"] is None  # (vLLM's answer has it, null)
    r = post(server, "/tokenize", {"prompt": "hello world", "return_token_strs": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == plain.json()["tokens"] and body["count"] == len(body["tokens"])
    assert len(body["token_strs"]) == body["count"] and all(isinstance(t, str) for t in body["token_strs"])
    chat = post(server, "/tokenize", {"messages": [{"role": "user", "content": "hi"}], "return_token_strs": True})
    assert chat.status_code == 200 and "<|im_start|>" in chat.json()["token_strs"]


def test_tokenize_continue_final_message(server):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, here"}]
    closed = post(server, "/tokenize", {"messages": msgs, "add_generation_prompt": False})
    cont = post(server, "/tokenize", {"messages": msgs, "add_generation_prompt": False,
                                      "continue_final_message": True})
    assert cont.status_code == 200, cont.text
    # the prompt ends right after the final message's text: its end-of-turn tokens are gone
    detok = post(server, "/detokenize", {"tokens": cont.json()["tokens"]}).json()["prompt"]
    assert detok.endswith("Sure, here") and cont.json()["count"] < closed.json()["count"]
    for body in ({"messages": msgs, "continue_final_message": True},  # add_generation_prompt defaults to true
                 {"messages": msgs, "continue_final_message": True, "add_generation_prompt": True},
                 {"prompt": "hi", "continue_final_message": True, "add_generation_prompt": False}):
        r = post(server, "/tokenize", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message", (body, r.text)
