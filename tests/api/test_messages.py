"""Anthropic's /v1/messages with the official anthropic client, on an instance and on the gateway.

The oracle is the chat route's greedy answer to the same conversation (system,
tool_use and tool_result blocks replayed as chat turns)."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pytest

from tests.api.live import WEATHER_PARAMS, chat_text

TOOL = {"name": "get_weather", "description": "the weather in a city", "input_schema": WEATHER_PARAMS}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                                "parameters": WEATHER_PARAMS}}]


GREEDY = {"temperature": 0}  # newer SDKs dropped the argument; the API still takes it


@pytest.fixture()
def client(host):
    url, key = host
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=60)


def _auth(host) -> dict:
    return {"authorization": f"Bearer {host[1]}"}


def test_plain_equals_the_chat_answer(client, host):
    m = client.messages.create(model="tiny", max_tokens=12, extra_body=GREEDY, system="be brief",
                               messages=[{"role": "user", "content": "hello there"}])
    want = chat_text(host[0], [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}],
                     _auth(host), max_tokens=12)
    assert m.type == "message" and m.role == "assistant" and m.content[0].type == "text"
    assert m.content[0].text == want
    assert m.stop_reason in ("end_turn", "max_tokens") and m.usage.output_tokens <= 12 and m.usage.input_tokens > 0


def test_streamed_text_and_events(client):
    kw = dict(model="tiny", max_tokens=16, extra_body=GREEDY, messages=[{"role": "user", "content": "count"}])
    whole = client.messages.create(**kw).content[0].text
    with client.messages.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds and "message_delta" in kinds
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == whole == final.content[0].text
    assert final.usage.output_tokens > 0
    # message_start already counts the prompt (langchain and others read it there)
    assert events[0].message.usage.input_tokens == final.usage.input_tokens > 0


def test_stop_sequences_name_the_one_that_matched(client):
    kw = dict(model="tiny", max_tokens=24, extra_body=GREEDY, messages=[{"role": "user", "content": "say something"}])
    whole = client.messages.create(**kw).content[0].text
    assert len(whole) > 6
    stop = whole[4:7]
    cut = whole[:whole.index(stop)]
    m = client.messages.create(**kw, stop_sequences=["\x01never", stop])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert (m.content[0].text if m.content else "") == cut
    with client.messages.stream(**kw, stop_sequences=[stop]) as s:
        final = s.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop
    assert (final.content[0].text if final.content else "") == cut


def test_tool_use_round_trip(client, host):
    ask = [{"role": "user", "content": "weather in Paris?"}]
    m = client.messages.create(model="tiny", max_tokens=150, extra_body=GREEDY, tools=[TOOL], messages=ask,
                               tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True})
    assert m.stop_reason == "tool_use"
    use = [b for b in m.content if b.type == "tool_use"]
    assert len(use) == 1 and use[0].name == "get_weather"
    jsonschema.validate(use[0].input, WEATHER_PARAMS)
    follow = [*ask, {"role": "assistant", "content": [b.model_dump() for b in m.content]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use[0].id, "content": "sunny"}]}]
    answer = client.messages.create(model="tiny", max_tokens=10, extra_body=GREEDY, tools=[TOOL], messages=follow)
    chat = [*ask, {"role": "assistant", "content": None, "tool_calls": [
        {"id": use[0].id, "type": "function", "function": {"name": "get_weather",
                                                           "arguments": json.dumps(use[0].input)}}]},
        {"role": "tool", "tool_call_id": use[0].id, "content": "sunny"}]
    want = chat_text(host[0], chat, _auth(host), tools=CHAT_TOOLS, max_tokens=10)
    assert (answer.content[0].text if answer.content else "") == want


def test_streamed_tool_use(client):
    with client.messages.stream(model="tiny", max_tokens=150, extra_body=GREEDY, tools=[TOOL],
                                tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                messages=[{"role": "user", "content": "weather?"}]) as s:
        final = s.get_final_message()
    use = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and len(use) == 1
    jsonschema.validate(use[0].input, WEATHER_PARAMS)


def test_thinking_as_anthropic_clients_send_it_is_what_the_model_can_do(client):
    """Claude Code and the SDK send it (a 400 by name before); the tiny model's template has no
    enable_thinking switch and the server no reasoning parser: disabled is what it does anyway,
    enabled a 400 naming thinking, on the instance and through the gateway."""
    kw = dict(model="tiny", max_tokens=1030, extra_body={**GREEDY, "stop_sequences": ["."]},
              messages=[{"role": "user", "content": "hi"}])
    plain = client.messages.create(**kw)
    m = client.messages.create(**kw, thinking={"type": "disabled"})
    assert m.content == plain.content and [b.type for b in m.content] == ["text"]
    with pytest.raises(anthropic.BadRequestError, match="thinking.type 'enabled' cannot be honoured"):
        client.messages.create(**kw, thinking={"type": "enabled", "budget_tokens": 1024})
    # a client's own header asks nothing: the translation sets it from the body
    m = client.messages.create(**kw, extra_headers={"x-llmserve-thinking": "enabled"})
    assert m.content == plain.content


def test_output_config_json_schema(client):
    from tests.api.live import COLOUR

    m = client.messages.create(model="tiny", max_tokens=40, messages=[{"role": "user", "content": "a colour"}],
                               output_config={"format": {"type": "json_schema", "schema": COLOUR}})
    jsonschema.validate(json.loads(m.content[0].text), COLOUR)


BAD = [
    {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},  # no model
    {"model": "tiny", "messages": [{"role": "user", "content": "x"}]},  # no max_tokens
    {"model": "tiny", "max_tokens": 5, "messages": []},
    {"model": "tiny", "max_tokens": 5, "messages": [{"role": "assistant", "content": "x"}]},
    {"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
    {"model": "tiny", "max_tokens": 5, "thinking": {"type": "enabled", "budget_tokens": 1024},
     "messages": [{"role": "user", "content": "x"}]},
    {"model": "tiny", "max_tokens": 5, "temperature": 1.5, "messages": [{"role": "user", "content": "x"}]},
    {"model": "tiny", "max_tokens": 5, "tools": [{"type": "web_search_20250305", "name": "web_search"}],
     "messages": [{"role": "user", "content": "x"}]},
    {"model": "tiny", "max_tokens": 5, "tool_choice": {"type": "tool", "name": "nope"},
     "messages": [{"role": "user", "content": "x"}]},
    {"model": "not-served", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
    {"model": "tiny", "max_tokens": 5, "bogus": True, "messages": [{"role": "user", "content": "x"}]},
]


@pytest.mark.parametrize("body", BAD)
def test_bad_requests_get_anthropic_errors(host, body):
    r = httpx.post(host[0] + "/v1/messages", json=body, headers={"x-api-key": host[1]}, timeout=30)
    assert 400 <= r.status_code < 500, r.text
    data = r.json()
    assert data["type"] == "error" and data["error"]["type"].endswith("_error") and data["error"]["message"]


def test_malformed_bytes_and_the_sdk_error(host, client):
    r = httpx.post(host[0] + "/v1/messages", content=b"{oops", headers={"x-api-key": host[1]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="tiny", max_tokens=5, extra_body=GREEDY, messages=[{"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}])


def test_an_anthropic_path_not_served_is_an_anthropic_404(host, client):
    r = httpx.post(host[0] + "/v1/messages/count_tokens", json={"model": "tiny", "messages": []},
                   headers={"x-api-key": host[1]}, timeout=30)
    assert r.status_code == 404 and r.json()["type"] == "error" and r.json()["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="tiny", messages=[{"role": "user", "content": "x"}])


def test_x_api_key_is_the_gateway_key(gateway):
    bad = anthropic.Anthropic(base_url=gateway.url, api_key="not-a-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": "x"}])
    r = httpx.post(gateway.url + "/v1/messages", json={"model": "tiny", "max_tokens": 2,
                                                       "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
