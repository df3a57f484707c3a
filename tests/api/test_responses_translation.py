"""/v1/responses' translation of chat answers, fed the chat shapes the instance sends:
output items are streamed one after another (each done before the next is added), and
the item max_output_tokens cut is ``incomplete``, not ``completed``."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from llmserve.api import responses
from llmserve.api.responses_protocol import ResponsesRequest


def _env(**kw) -> responses.Envelope:
    return responses.Envelope(ResponsesRequest.model_validate({"model": "m", "input": "hi", **kw}), None)


def _chunk(delta: dict, finish: str | None = None) -> dict:
    return {"model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _call(i: int, args: str, first: bool = False) -> dict:
    tc: dict = {"index": i, "function": {"arguments": args}}
    if first:
        tc.update(id=f"call_{i}", type="function", function={"name": "f", "arguments": args})
    return _chunk({"tool_calls": [tc]})


def _run(chunks: list[dict], **kw) -> tuple[list[dict], dict]:
    stream = responses.EventStream(_env(stream=True, **kw))

    async def run():
        async def gen():
            for c in chunks:
                yield c
        return [e async for e in stream.run(gen())]
    raw = asyncio.run(run()) + [stream.final_event()]
    return [json.loads(e.decode().split("data: ", 1)[1]) for e in raw], stream.response


def _assert_items_in_order(events: list[dict]) -> None:
    open_, last = None, -1
    for e in events:
        idx = e.get("output_index")
        if e["type"] == "response.output_item.added":
            assert open_ is None and idx == last + 1, [x["type"] for x in events]
            open_ = last = idx
        elif e["type"] == "response.output_item.done":
            assert idx == open_
            open_ = None
        elif idx is not None:
            assert idx == open_, e
    assert open_ is None


def test_streamed_items_are_done_before_the_next_is_added():
    chunks = [_chunk({"role": "assistant", "content": "let me see"}), _call(0, "", first=True), _call(0, '{"a": 1}'),
              _call(1, "", first=True), _call(1, '{"a": 2}'), _chunk({}, "tool_calls")]
    events, resp = _run(chunks, tools=[{"type": "function", "name": "f"}])
    _assert_items_in_order(events)
    assert [(o["type"], o["status"]) for o in resp["output"]] == \
        [("message", "completed"), ("function_call", "completed"), ("function_call", "completed")]
    assert [o.get("arguments") for o in resp["output"][1:]] == ['{"a": 1}', '{"a": 2}']


def test_the_item_cut_by_max_output_tokens_is_incomplete():
    events, resp = _run([_chunk({"role": "assistant", "content": "one two"}), _chunk({"content": " three"}, "length")])
    assert resp["status"] == "incomplete" and events[-1]["type"] == "response.incomplete"
    assert resp["output"][0]["status"] == "incomplete"
    assert next(e for e in events if e["type"] == "response.output_item.done")["item"]["status"] == "incomplete"
    events, resp = _run([_chunk({"role": "assistant", "content": "hm"}), _call(0, "", first=True),
                         _call(0, '{"a": '), _chunk({}, "length")], tools=[{"type": "function", "name": "f"}])
    assert [o["status"] for o in resp["output"]] == ["completed", "incomplete"]
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "one two three"},
                         "finish_reason": "length"}]}
    whole = responses.from_chat(_env(), body)
    assert whole["status"] == "incomplete" and whole["output"][0]["status"] == "incomplete"


def test_the_response_echoes_the_request_fields_openai_echoes():
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}
    r = responses.from_chat(_env(safety_identifier="user-7", prompt_cache_key="k1", service_tier="auto", user="u"),
                            body)
    assert (r["safety_identifier"], r["prompt_cache_key"], r["user"]) == ("user-7", "k1", "u")
    assert (r["service_tier"], r["background"], r["top_logprobs"], r["text"]["verbosity"]) == \
        ("default", False, 0, "medium")
    assert r["max_tool_calls"] is None and "max_tool_calls" in r


@pytest.fixture()
def client(host):
    return openai.OpenAI(base_url=host[0] + "/v1", api_key=host[1], max_retries=0, timeout=60)


def test_live_max_output_tokens_cut_is_incomplete_whole_and_streamed(client):
    kw = dict(model="tiny", input="tell me a long story", max_output_tokens=3, temperature=0)
    r = client.responses.create(**kw)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[-1].status == "incomplete"
    events = list(client.responses.create(**kw, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.output[-1].status == "incomplete"


@pytest.mark.parametrize("field,value", [("background", False), ("include", []), ("top_logprobs", 0)])
def test_openai_defaults_of_unimplemented_fields_are_taken(client, field, value):
    r = client.responses.create(model="tiny", input="hi", max_output_tokens=2, extra_body={field: value})
    assert r.status in ("completed", "incomplete")


@pytest.mark.parametrize("field,value", [("background", True), ("include", ["message.output_text.logprobs"]),
                                         ("top_logprobs", 2), ("top_logprobs", False), ("stream_options", False),
                                         ("reasoning", {"effort": "low"})])
def test_other_values_of_unimplemented_fields_are_unsupported_parameter(client, field, value):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="tiny", input="hi", max_output_tokens=2, extra_body={field: value})
    err = e.value.body
    assert (e.value.status_code, err["code"], err["param"]) == (400, "unsupported_parameter", field), err


def test_reasoning_is_an_item_before_the_message_whole_and_streamed():
    """Chat's reasoning (both names carry one text) as OpenAI's reasoning item, then the message."""
    chunks = [_chunk({"role": "assistant", "reasoning": "hm", "reasoning_content": "hm"}),
              _chunk({"reasoning": " ok", "reasoning_content": " ok"}), _chunk({"content": "Blue"}, "stop"),
              {"model": "m", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8,
                                                      "completion_tokens_details": {"reasoning_tokens": 4}}}]
    events, final = _run(chunks)
    _assert_items_in_order(events)
    kinds = [e["type"] for e in events]
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") == "hm ok"
    whole = responses.from_chat(_env(), {"model": "m", "choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "Blue", "reasoning": "hm ok", "reasoning_content": "hm ok"}}],
        "usage": chunks[-1]["usage"]})
    for obj in (whole, final):
        r = openai.types.responses.Response.model_validate(obj)
        assert [o.type for o in r.output] == ["reasoning", "message"]
        assert r.output[0].content[0].text == "hm ok" and r.output[0].summary == []
        assert r.usage.output_tokens_details.reasoning_tokens == 4
        # the next turn's prompt replays the reasoning (a template may render it)
        assert responses.assistant_message(obj["output"])["reasoning_content"] == "hm ok"


def test_a_reasoning_input_item_is_the_next_assistant_turns_reasoning_and_a_bad_one_a_400():
    from llmserve.api.errors import APIError
    from llmserve.api.parse import parse_model

    def parsed(reasoning: dict) -> ResponsesRequest:
        body = {"model": "tiny", "input": [{"type": "message", "role": "user", "content": "hi"}, reasoning,
                                           {"type": "message", "role": "assistant", "content": "ok"}]}
        return parse_model(json.dumps(body).encode(), ResponsesRequest)

    item = {"type": "reasoning", "id": "rs_1", "summary": [],
            "content": [{"type": "reasoning_text", "text": "a"}, {"type": "other"}, {"type": "reasoning_text", "text": "b"}]}
    msgs = responses.input_messages(parsed(item))
    assert msgs[-1] == {"role": "assistant", "content": "ok", "reasoning_content": "ab"}
    # a part's text that is no string is the caller's 400 (it was a TypeError, a 500)
    with pytest.raises(APIError) as e:
        parsed({**item, "content": [{"type": "reasoning_text", "text": 5}]})
    assert e.value.status == 400
