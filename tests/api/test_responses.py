"""/v1/responses with the official openai client, on an instance and on the gateway.

The oracle is the chat route: a greedy response must equal the greedy chat
completion of the conversation it stands for (instructions, chained turns and
tool results included), so a turn dropped or misplaced in the translation fails."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.api.live import COLOUR, WEATHER_PARAMS, chat_text

TOOL = {"type": "function", "name": "get_weather", "description": "the weather in a city",
        "parameters": WEATHER_PARAMS}


@pytest.fixture()
def client(host):
    url, key = host
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


def _auth(host) -> dict:
    return {"authorization": f"Bearer {host[1]}"}


def test_plain_equals_the_chat_answer(client, host):
    r = client.responses.create(model="tiny", input="hello there", instructions="be brief",
                                max_output_tokens=12, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_")
    want = chat_text(host[0], [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}],
                     _auth(host), max_completion_tokens=12)
    assert r.output_text == want and want
    assert r.usage.output_tokens <= 12 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.status in ("completed", "incomplete")
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"


def test_streamed_events_carry_the_same_text(client):
    kw = dict(model="tiny", input=[{"role": "user", "content": "count to five"}], max_output_tokens=16,
              temperature=0)
    whole = client.responses.create(**kw).output_text
    events = list(client.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds.index("response.output_item.added") < kinds.index("response.output_text.delta")
    assert "response.output_text.done" in kinds and "response.output_item.done" in kinds
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole
    assert events[-1].response.output_text == whole
    # stored: GET gives the streamed response back
    assert client.responses.retrieve(events[-1].response.id).output_text == whole


def test_tool_round_trip_replays_the_call_and_its_result(client, host):
    first = client.responses.create(model="tiny", input="weather in Paris?", tools=[TOOL], tool_choice="required",
                                    parallel_tool_calls=False, max_output_tokens=150, temperature=0)
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    args = json.loads(calls[0].arguments)
    jsonschema.validate(args, WEATHER_PARAMS)
    second = client.responses.create(model="tiny", previous_response_id=first.id, tools=[TOOL],
                                     input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                             "output": "sunny, 21 C"}], max_output_tokens=10, temperature=0)
    assert second.previous_response_id == first.id
    messages = [{"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": calls[0].call_id, "type": "function",
                     "function": {"name": "get_weather", "arguments": calls[0].arguments}}]},
                {"role": "tool", "tool_call_id": calls[0].call_id, "content": "sunny, 21 C"}]
    tools = [{"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}]
    want = chat_text(host[0], messages, _auth(host), tools=tools, max_completion_tokens=10)
    assert second.output_text == want


def test_streamed_tool_call(client):
    events = list(client.responses.create(model="tiny", input="weather?", tools=[TOOL],
                                          tool_choice={"type": "function", "name": "get_weather"},
                                          parallel_tool_calls=False, max_output_tokens=150, temperature=0,
                                          stream=True))
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert deltas == done[0].arguments
    jsonschema.validate(json.loads(deltas), WEATHER_PARAMS)
    final = events[-1].response.output
    assert final[-1].type == "function_call" and final[-1].arguments == deltas


def test_objects_and_events_validate_against_the_sdks_types(host):
    """The SDK builds its objects without validating: a field it requires and we leave out
    (usage.input_tokens_details.cache_write_tokens) reads None, so the raw JSON is checked here."""
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    url, key = host
    bodies = [{"model": "tiny", "input": "hello", "max_output_tokens": 4, "temperature": 0},
              {"model": "tiny", "input": "weather?", "tools": [TOOL], "tool_choice": "required",
               "parallel_tool_calls": False, "max_output_tokens": 150, "temperature": 0}]
    events = TypeAdapter(ResponseStreamEvent)
    for body in bodies:
        r = httpx.post(url + "/v1/responses", json=body, headers=_auth(host), timeout=60)
        assert r.status_code == 200, r.text
        whole = Response.model_validate(r.json())
        assert whole.usage.input_tokens_details.cache_write_tokens == 0
        with httpx.stream("POST", url + "/v1/responses", json={**body, "stream": True}, headers=_auth(host),
                          timeout=60) as s:
            lines = [json.loads(x[6:]) for x in s.iter_lines() if x.startswith("data: ")]
        for ev in lines:
            events.validate_python(ev)
        assert lines[-1]["type"] in ("response.completed", "response.incomplete")


def test_json_schema_format(client):
    r = client.responses.create(model="tiny", input="pick a colour", max_output_tokens=40, temperature=1.0,
                                extra_body={"seed": 3},
                                text={"format": {"type": "json_schema", "name": "pick", "schema": COLOUR,
                                                 "strict": True}})
    jsonschema.validate(json.loads(r.output_text), COLOUR)
    assert r.text.format.type == "json_schema"


def test_previous_response_id_chain_and_delete(client, host):
    r1 = client.responses.create(model="tiny", input="first", max_output_tokens=6, temperature=0)
    r2 = client.responses.create(model="tiny", input="second", previous_response_id=r1.id, max_output_tokens=6,
                                 temperature=0)
    r3 = client.responses.create(model="tiny", input="third", previous_response_id=r2.id, instructions="terse",
                                 max_output_tokens=6, temperature=0)
    conv = [{"role": "system", "content": "terse"},
            {"role": "user", "content": "first"}, {"role": "assistant", "content": r1.output_text},
            {"role": "user", "content": "second"}, {"role": "assistant", "content": r2.output_text},
            {"role": "user", "content": "third"}]
    assert r3.output_text == chat_text(host[0], conv, _auth(host), max_completion_tokens=6)
    assert client.responses.retrieve(r2.id).output_text == r2.output_text
    with pytest.raises(openai.BadRequestError) as e:  # a query we do not implement: refused, not ignored
        client.responses.retrieve(r2.id, include=["message.output_text.logprobs"])
    assert e.value.body["param"].startswith("include")
    client.responses.delete(r2.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r2.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="tiny", input="x", previous_response_id=r2.id, max_output_tokens=2)


def test_store_false_is_not_stored(client):
    r = client.responses.create(model="tiny", input="hi", store=False, max_output_tokens=3)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


BAD = [
    ({}, "input"),
    ({"input": ""}, "input"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "x", "reasoning": {"effort": "high"}}, "reasoning"),
    ({"input": "x", "temperature": 3}, "temperature"),
    ({"input": "x", "bogus": 1}, "bogus"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": 5}}}}, None),
    ({"input": "x", "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "previous_response_id": "resp_missing"}, "previous_response_id"),
    ({"input": "x", "model": "not-served"}, "model"),
]


@pytest.mark.parametrize("body,param", BAD)
def test_bad_requests_are_openai_4xx(host, body, param):
    r = httpx.post(host[0] + "/v1/responses", json={"model": "tiny", **body} if "model" not in body else body,
                   headers=_auth(host), timeout=30)
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    if param is not None:
        assert err["param"] == param, err


def test_bad_bytes_and_methods(host):
    url = host[0] + "/v1/responses"
    for resp in (httpx.post(url, content=b"{not json", headers=_auth(host)),
                 httpx.post(url, content=b"[1, 2]", headers=_auth(host)),
                 httpx.put(url, json={}, headers=_auth(host)),
                 httpx.get(url + "/resp_nope", headers=_auth(host)),
                 httpx.post(url + "/x/y", headers=_auth(host))):
        assert 400 <= resp.status_code < 500, resp.text
        assert resp.json()["error"]["message"]


def test_openais_response_routes_not_served_are_404s_and_a_wrong_method_a_405(client):
    """The SDK's NotFoundError for what llmserve does not serve (it was a bare 405 for input_tokens)."""
    r = client.responses.create(model="tiny", input="hi", max_output_tokens=2)
    for call in (lambda: client.responses.input_tokens.count(model="tiny", input="hi"),
                 lambda: client.responses.input_items.list(r.id), lambda: client.responses.cancel(r.id),
                 lambda: client.responses.compact(model="tiny", input="hi")):
        with pytest.raises(openai.NotFoundError) as e:
            call()
        assert e.value.body["code"] == "not_found"
    wrong = httpx.post(f"{client.base_url}responses/{r.id}", json={}, headers={"authorization": f"Bearer {client.api_key}"})
    assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, DELETE"


def test_a_stream_without_model_names_the_answering_model_from_its_first_event(host):
    body = {"input": "hi", "max_output_tokens": 3, "stream": True}
    with httpx.stream("POST", host[0] + "/v1/responses", json=body, headers=_auth(host), timeout=60) as r:
        if r.status_code == 400:  # the gateway routes by model name: it asks for one
            r.read()
            assert r.json()["error"]["code"] == "missing_model"
            return
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    models = [e["response"]["model"] for e in events if "response" in e]
    assert events[0]["type"] == "response.created" and len(models) >= 3
    assert models[0] and set(models) == {models[0]}
