"""/v1/messages' translation of chat answers, fed the chat shapes the instance sends:
the stop sequence is the engine's match, usage splits cached input out, and streamed
content blocks never overlap (each stops before the next starts)."""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx
import pytest

from llmserve.api import messages
from llmserve.api.messages_protocol import MessagesRequest


def _req(**kw) -> MessagesRequest:
    return MessagesRequest.model_validate({"model": "m", "max_tokens": 40,
                                           "messages": [{"role": "user", "content": "count"}], **kw})


def _events(req: MessagesRequest, chunks: list[dict]) -> list[dict]:
    async def run():
        async def gen():
            for c in chunks:
                yield c
        return [e async for e in messages.stream_events(req, gen())]
    raw = asyncio.run(run())
    return [json.loads(e.decode().split("data: ", 1)[1]) for e in raw]


def _chunk(delta: dict, finish: str | None = None, stop_reason=None) -> dict:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish, "stop_reason": stop_reason}]}


def test_the_stop_sequence_is_the_one_the_engine_matched_and_the_text_is_chats():
    """Chat's text already leaves the match out (no include_stop_str_in_output is asked for,
    so a stop token's text never shows); its stop_reason names the match: "5", though the
    text also ends like "4\n" of "4\n5"."""
    req = _req(stop_sequences=["5", "4\n5"])
    assert "include_stop_str_in_output" not in messages.chat_body(req) and messages.chat_body(req)["stop"]
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "1\n2\n3\n4\n"},
                         "finish_reason": "stop", "stop_reason": "5"}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 9, "total_tokens": 18}}
    m = messages.from_chat(req, body)
    assert (m["content"][0]["text"], m["stop_reason"], m["stop_sequence"]) == ("1\n2\n3\n4\n", "stop_sequence", "5")
    events = _events(_req(stop_sequences=["5", "4\n5"], stream=True),
                     [_chunk({"role": "assistant", "content": "1\n2\n3"}), _chunk({"content": "\n4\n"}, "stop", "5")])
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    end = next(e for e in events if e["type"] == "message_delta")
    assert (text, end["delta"]) == ("1\n2\n3\n4\n", {"stop_reason": "stop_sequence", "stop_sequence": "5"})


def test_an_eos_or_a_stop_token_after_text_ending_like_a_stop_sequence_is_end_turn():
    for stop_reason in (None, 7):
        body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "a 5"},
                             "finish_reason": "stop", "stop_reason": stop_reason}]}
        m = messages.from_chat(_req(stop_sequences=["5"]), body)
        assert (m["content"][0]["text"], m["stop_reason"], m["stop_sequence"]) == ("a 5", "end_turn", None)


def test_usage_input_tokens_exclude_the_cached_ones():
    u = messages.usage({"prompt_tokens": 180, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 176}})
    assert (u["input_tokens"], u["cache_read_input_tokens"], u["output_tokens"]) == (4, 176, 3)


def _call(i: int, *, first: bool, args: str) -> dict:
    tc: dict = {"index": i, "function": {"arguments": args}}
    if first:
        tc.update(id=f"call_{i}", type="function", function={"name": "f", "arguments": args})
    return _chunk({"tool_calls": [tc]})


def _assert_blocks_in_order(events: list[dict]) -> None:
    """Anthropic's stream: block i starts after block i-1 stopped, deltas only to the open block."""
    open_, last = None, -1
    for e in events:
        if e["type"] == "content_block_start":
            assert open_ is None and e["index"] == last + 1, events
            open_ = last = e["index"]
        elif e["type"] == "content_block_delta":
            assert e["index"] == open_, events
        elif e["type"] == "content_block_stop":
            assert e["index"] == open_, events
            open_ = None
    assert open_ is None


def test_streamed_blocks_stop_before_the_next_starts():
    chunks = [_chunk({"role": "assistant", "content": "let me see"}),
              _call(0, first=True, args=""), _call(0, first=False, args='{"a": 1}'),
              _call(1, first=True, args=""), _call(1, first=False, args='{"a": 2}'),
              _chunk({}, "tool_calls")]
    events = _events(_req(stream=True), chunks)
    _assert_blocks_in_order(events)
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["text", "tool_use", "tool_use"]
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_reasoning_is_a_thinking_block_before_the_text_whole_and_streamed():
    chunks = [_chunk({"role": "assistant", "reasoning": "hm", "reasoning_content": "hm"}),
              _chunk({"reasoning": " ok", "reasoning_content": " ok"}), _chunk({"content": "Blue"}),
              _call(0, first=True, args="{}"), _chunk({}, "tool_calls")]
    events = _events(_req(stream=True), chunks)
    _assert_blocks_in_order(events)
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert starts[0] == {"type": "thinking", "thinking": "", "signature": ""}
    assert [b["type"] for b in starts] == ["thinking", "text", "tool_use"]
    assert "".join(e["delta"]["thinking"] for e in events if e["type"] == "content_block_delta"
                   and e["delta"]["type"] == "thinking_delta") == "hm ok"
    whole = messages.from_chat(_req(), {"choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "Blue", "reasoning": "hm ok", "reasoning_content": "hm ok"}}]})
    m = anthropic.types.Message.model_validate(whole)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert (m.content[0].thinking, m.content[0].signature) == ("hm ok", "")
    # sent back, the thinking is the assistant turn's reasoning; in a user turn, a 400
    follow = _req(messages=[{"role": "user", "content": "colour?"}, {"role": "assistant", "content": whole["content"]},
                            {"role": "user", "content": "again"}])
    assert messages.chat_body(follow)["messages"][1] == {"role": "assistant", "content": [
        {"type": "text", "text": "Blue"}], "reasoning_content": "hm ok"}
    with pytest.raises(Exception, match="thinking blocks are only allowed in assistant messages"):
        _req(messages=[{"role": "user", "content": [{"type": "thinking", "thinking": "x", "signature": ""}]}])


# ---- live, on an instance and through the gateway ------------------------------------------

@pytest.fixture()
def client(host):
    return anthropic.Anthropic(base_url=host[0], api_key=host[1], max_retries=0, timeout=60)


def test_cached_prompt_tokens_are_cache_reads_not_input(client, host):
    system = "You answer in one short sentence about the weather and nothing else. " * 6
    kw = dict(model="tiny", max_tokens=2, system=system, extra_body={"temperature": 0},
              messages=[{"role": "user", "content": "hello"}])
    client.messages.create(**kw)  # fills the prefix cache
    m = client.messages.create(**kw)
    chat = httpx.post(host[0] + "/v1/chat/completions", timeout=60, headers={"authorization": f"Bearer {host[1]}"},
                      json={"model": "tiny", "max_tokens": 2, "messages": [{"role": "system", "content": system},
                                                                          {"role": "user", "content": "hello"}]})
    prompt = chat.json()["usage"]["prompt_tokens"]
    assert m.usage.cache_read_input_tokens > 0
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == prompt
    with client.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert final.usage.cache_read_input_tokens > 0
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == prompt


_TOOL = {"name": "f", "input_schema": {"type": "object"}}
_USE = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
_RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}
_ASK = {"role": "user", "content": "hi"}


@pytest.mark.parametrize("fields,says", [
    ({"messages": [{"role": "user", "content": [_USE]}]}, "tool_use"),
    ({"messages": [{"role": "user", "content": [_RESULT]}]}, "tool_use_id"),
    ({"messages": [_ASK, {"role": "assistant", "content": [{"type": "tool_use", **{**_USE, "id": "toolu_2"}}]},
                   {"role": "user", "content": [_RESULT]}]}, "tool_use_id"),
    ({"messages": [_ASK, {"role": "assistant", "content": [_USE, _RESULT]}]}, "tool_result"),
    ({"messages": [{"role": "user", "content": []}]}, "non-empty"),
    ({"messages": [{"role": "user", "content": ""}]}, "non-empty"),
    ({"messages": [_ASK, {"role": "assistant", "content": ""}, _ASK]}, "non-empty"),
    ({"messages": [_ASK, {"role": "assistant", "content": "Sure, "}]}, "trailing whitespace"),
    ({"messages": [_ASK, {"role": "assistant", "content": [{"type": "text", "text": "a\n"}]}]}, "trailing whitespace"),
    ({"messages": [_ASK], "tool_choice": {"type": "auto"}}, "tool_choice"),
    ({"messages": [_ASK], "tools": [_TOOL],
      "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}, "output_config.format"),
])
def test_what_anthropic_refuses_is_an_anthropic_400(host, fields, says):
    r = httpx.post(host[0] + "/v1/messages", json={"model": "tiny", "max_tokens": 2, **fields},
                   headers={"x-api-key": host[1]}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert says in err["error"]["message"] and "response_format" not in err["error"]["message"], err


def test_a_result_answering_an_earlier_call_and_a_format_with_tool_choice_none_are_taken(client):
    m = client.messages.create(model="tiny", max_tokens=2, tools=[_TOOL], messages=[
        _ASK, {"role": "assistant", "content": [_USE]}, {"role": "user", "content": [_RESULT]}])
    assert m.type == "message"
    m = client.messages.create(model="tiny", max_tokens=2, tools=[_TOOL], tool_choice={"type": "none"},
                               messages=[_ASK], output_config={"format": {"type": "json_schema",
                                                                         "schema": {"type": "object"}}})
    assert m.type == "message"


def test_an_empty_final_assistant_turn_prefills_nothing():
    """Anthropic takes it and answers as without it: no empty assistant turn in the prompt."""
    for content in ("", []):
        body = messages.chat_body(_req(messages=[{"role": "user", "content": "hi"},
                                                 {"role": "assistant", "content": content}]))
        assert body["messages"] == [{"role": "user", "content": "hi"}]
        assert "continue_final_message" not in body


def test_a_stream_that_is_only_the_stop_sequence_has_no_empty_text_block():
    """As the unstreamed answer (content []): chat sends no text for the stop sequence alone."""
    events = _events(_req(stop_sequences=["\n"], stream=True),
                     [_chunk({"role": "assistant", "content": ""}, "stop", "\n")])
    assert [e["type"] for e in events] == ["message_start", "message_delta", "message_stop"]
    assert events[1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "\n"}


@pytest.mark.parametrize("thinking, kwargs", [
    ({"type": "disabled"}, {"enable_thinking": False}),
    ({"type": "enabled", "budget_tokens": 1024}, {"enable_thinking": True}),
    ({"type": "enabled", "budget_tokens": 2000, "display": "summarized"}, {"enable_thinking": True}),
    ({"type": "adaptive"}, None),  # the template's default
])
def test_thinking_is_the_templates_enable_thinking(thinking, kwargs):
    """What Claude Code and the SDK send: taken (it was a 400 by name), as Qwen3's switch."""
    body = messages.chat_body(_req(max_tokens=4096, thinking=thinking))
    assert body.get("chat_template_kwargs") == kwargs


@pytest.mark.parametrize("thinking, says", [
    ({"type": "enabled"}, "budget_tokens"),
    ({"type": "enabled", "budget_tokens": 1023}, "greater than or equal to 1024"),
    ({"type": "enabled", "budget_tokens": 4096}, "max_tokens` must be greater than"),
    ({"type": "disabled", "budget_tokens": 1024}, "only allowed with thinking.type 'enabled'"),
    ({"type": "enabled", "budget_tokens": 1024, "display": "omitted"}, "display"),
    ({"type": "on"}, "type"),
])
def test_a_thinking_budget_is_checked_as_anthropic_does(thinking, says):
    with pytest.raises(Exception, match=says):
        _req(max_tokens=4096, thinking=thinking)


def test_redacted_thinking_sent_back_is_taken_and_dropped():
    """Clients send an answer's blocks back whole; Claude's encrypted thinking carries nothing we read."""
    follow = _req(messages=[{"role": "user", "content": "colour?"}, {"role": "assistant", "content": [
        {"type": "redacted_thinking", "data": "EmwKAhgB"}, {"type": "text", "text": "Blue"}]},
        {"role": "user", "content": "again"}])
    assert messages.chat_body(follow)["messages"][1] == {"role": "assistant", "content": [
        {"type": "text", "text": "Blue"}]}
    with pytest.raises(Exception, match="redacted_thinking blocks are only allowed in assistant messages"):
        _req(messages=[{"role": "user", "content": [{"type": "redacted_thinking", "data": "x"}]}])
