"""Reasoning through /v1/responses and /v1/messages: a ``reasoning`` output item (OpenAI's
shape, ``reasoning_text`` streamed) and its ``reasoning_tokens``, and a ``thinking`` block
(Anthropic's, ``thinking_delta`` streamed), read by the SDKs, whole and streamed. Here with
``deepseek_r1``: the tiny model writes no ``</think>``, so all it writes is reasoning."""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.helpers import make_tiny_llama
from tests.server.harness import start_engine


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = make_tiny_llama(tmp_path_factory.mktemp("model"), max_position_embeddings=2048)  # (a thinking budget)
    ep = start_engine(model, tmp_path_factory.mktemp("logs"), "--served-model-name", "tiny",
                      "--reasoning-parser", "deepseek_r1")
    yield ep
    ep.stop()


def _chat_reasoning(server) -> tuple[str, dict]:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                       temperature=0)
    return r.choices[0].message.reasoning, r.usage


def test_responses_reasoning_item_and_tokens(server):
    want, chat_usage = _chat_reasoning(server)
    assert want and chat_usage.completion_tokens_details.reasoning_tokens == chat_usage.completion_tokens == 6
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    kw = dict(model="tiny", input="Hi", max_output_tokens=6, temperature=0)
    r = client.responses.create(**kw)
    (item,) = r.output
    assert item.type == "reasoning" and item.summary == [] and [c.type for c in item.content] == ["reasoning_text"]
    assert item.content[0].text == want and r.usage.output_tokens_details.reasoning_tokens == 6
    events = list(client.responses.create(**kw, stream=True))
    final = events[-1].response  # (response.incomplete: max_output_tokens cut it)
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == want
    assert [e.text for e in events if e.type == "response.reasoning_text.done"] == [want]
    assert final.output[0].type == "reasoning" and final.output[0].content[0].text == want
    assert final.usage.output_tokens_details.reasoning_tokens == 6
    # the item sent back as input is taken (it becomes the assistant turn's reasoning)
    again = client.responses.create(**{**kw, "input": [{"role": "user", "content": "Hi"}, final.output[0].model_dump(),
                                                       {"role": "user", "content": "More"}]})
    assert again.output[0].type == "reasoning"


def test_messages_thinking_enabled_is_taken_disabled_is_a_400(server):
    """A template without an enable_thinking switch on a reasoning server: the model always thinks."""
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    kw = dict(model="tiny", max_tokens=1030, messages=[{"role": "user", "content": "Hi"}],
              extra_body={"temperature": 0, "stop_sequences": ["."]})
    m = client.messages.create(**kw, thinking={"type": "enabled", "budget_tokens": 1024})
    assert m.content[0].type == "thinking"
    with pytest.raises(anthropic.BadRequestError, match="thinking.type 'disabled' cannot be honoured"):
        client.messages.create(**kw, thinking={"type": "disabled"})


def test_messages_thinking_block(server):
    want, _ = _chat_reasoning(server)
    client = anthropic.Anthropic(base_url=server.url, api_key="x")
    kw = dict(model="tiny", max_tokens=6, messages=[{"role": "user", "content": "Hi"}], extra_body={"temperature": 0})
    m = client.messages.create(**kw)
    assert [b.type for b in m.content] == ["thinking"] and m.content[0].thinking == want
    with client.messages.stream(**kw) as s:
        events = list(s)
        final = s.get_final_message()
    assert "".join(e.delta.thinking for e in events if e.type == "content_block_delta") == want
    assert [b.type for b in final.content] == ["thinking"] and final.content[0].thinking == want
    # the thinking block sent back is taken
    follow = [*kw["messages"], {"role": "assistant", "content": [b.model_dump() for b in m.content] + [
        {"type": "text", "text": "ok"}]}, {"role": "user", "content": "More"}]
    assert client.messages.create(**{**kw, "messages": follow}).content[0].type == "thinking"
