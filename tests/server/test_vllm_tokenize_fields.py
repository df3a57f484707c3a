"""vLLM's ``/tokenize`` fields on an engine: ``return_token_strs`` (the answer's ``token_strs``)
and, with ``messages``, ``continue_final_message`` (vLLM's TokenizeChatRequest / TokenizeResponse)."""

from __future__ import annotations

import pytest

from tests.helpers import make_tiny_llama
from tests.server.harness import post, start_engine

CTX = 128


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = make_tiny_llama(tmp_path_factory.mktemp("model"), max_position_embeddings=CTX)
    # a tokenizer that adds a BOS to a text, as Llama's does (id 0 here)
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)])
    tok.save(str(model / "tokenizer.json"))
    ep = start_engine(model, tmp_path_factory.mktemp("logs"), "--served-model-name", "tiny")
    yield ep
    ep.stop()


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


def test_tokenize_add_special_tokens_as_vllm(server):
    """With messages it was accepted and ignored: vLLM defaults it to false there and, when true,
    adds the tokenizer's special tokens (BOS) on top of the template's; a prompt defaults to true."""
    msgs = [{"role": "user", "content": "hi"}]
    chat = post(server, "/tokenize", {"messages": msgs}).json()["tokens"]
    assert post(server, "/tokenize", {"messages": msgs, "add_special_tokens": False}).json()["tokens"] == chat
    assert chat[0] != 0
    r = post(server, "/tokenize", {"messages": msgs, "add_special_tokens": True})
    assert r.status_code == 200 and r.json()["tokens"] == [0, *chat], r.text
    prompt = post(server, "/tokenize", {"prompt": "hello"}).json()["tokens"]
    bare = post(server, "/tokenize", {"prompt": "hello", "add_special_tokens": False}).json()["tokens"]
    assert prompt == [0, *bare]
