"""Every parameter the installed openai SDK's ``create`` methods can send is either a field
llmserve reads or refused by name (400 ``unsupported_parameter``), as docs/openai-api.md
promises: never the ``unknown_parameter`` a typo gets."""

from __future__ import annotations

import json

import pytest
from openai.types import completion_create_params as cmpl
from openai.types.chat import completion_create_params as chat
from openai.types.responses import response_create_params as resp

from llmserve.api.errors import APIError
from llmserve.api.parse import parse_model
from llmserve.api.protocol import ChatCompletionRequest, CompletionRequest
from llmserve.api.responses_protocol import ResponsesRequest

CASES = [(chat.CompletionCreateParamsBase, ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}]}),
         (cmpl.CompletionCreateParamsBase, CompletionRequest, {"prompt": "hi"}),
         (resp.ResponseCreateParamsBase, ResponsesRequest, {"input": "hi"})]


def _parse(model, body: dict):
    try:
        return parse_model(json.dumps(body).encode(), model)
    except APIError as e:
        return e


@pytest.mark.parametrize("sdk,model,base", CASES, ids=["chat", "completions", "responses"])
def test_every_sdk_parameter_is_read_or_refused_by_name(sdk, model, base):
    known = {f.alias or n for n, f in model.model_fields.items()}
    for name in sorted(set(sdk.__annotations__) - known):
        e = _parse(model, {**base, name: {"x": 1}})
        assert isinstance(e, APIError) and e.status == 400, name
        assert (e.code, e.param) == ("unsupported_parameter", name), (name, e.code, e.message)


def test_chat_takes_openais_no_op_hints_and_only_the_default_verbosity():
    base = CASES[0][2]
    r = _parse(ChatCompletionRequest, {**base, "safety_identifier": "user-hash", "prompt_cache_key": "k",
                                       "verbosity": "medium"})
    assert isinstance(r, ChatCompletionRequest), r
    e = _parse(ChatCompletionRequest, {**base, "verbosity": "low"})
    assert isinstance(e, APIError) and (e.status, e.param) == (400, "verbosity")


def test_an_sdk_answers_model_dump_goes_back_as_history():
    """``messages.append(r.choices[0].message.model_dump())``: every field the SDK's message has,
    null where unset (audio, function_call, tool_calls) and annotations as OpenAI sends them."""
    from openai.types.chat import ChatCompletion

    r = ChatCompletion.model_validate({"id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hello", "refusal": None,
                                                          "annotations": []}}]})
    said = r.choices[0].message.model_dump()
    assert said["audio"] is None and said["function_call"] is None
    history = [{"role": "user", "content": "hi"}, said, {"role": "user", "content": "and?"}]
    req = _parse(ChatCompletionRequest, {"messages": history})
    assert isinstance(req, ChatCompletionRequest), req
    assert req.messages[1].for_template() == {"role": "assistant", "content": "hello"}
    for field, value in (("audio", {"id": "audio_1"}), ("function_call", {"name": "f", "arguments": "{}"})):
        e = _parse(ChatCompletionRequest, {"messages": [history[0], {**said, field: value}]})
        assert isinstance(e, APIError) and (e.code, e.param) == ("unsupported_parameter", f"messages[1].{field}")


def test_stream_options_include_obfuscation_false_is_taken_true_refused():
    base = {**CASES[0][2], "stream": True}
    ok = _parse(ChatCompletionRequest, {**base, "stream_options": {"include_usage": True, "include_obfuscation": False}})
    assert isinstance(ok, ChatCompletionRequest), ok
    e = _parse(ChatCompletionRequest, {**base, "stream_options": {"include_obfuscation": True}})
    assert isinstance(e, APIError) and e.param == "stream_options.include_obfuscation"


def test_a_responses_output_model_dump_goes_back_as_input():
    """``input += [item.model_dump() for item in r.output]``: null fields (``phase``, ``caller``,
    ``namespace``, ``async_``) are fields not given; ``phase`` set is taken."""
    from openai.types.responses import Response

    r = Response.model_validate({
        "id": "resp_1", "object": "response", "created_at": 1, "model": "m", "parallel_tool_calls": True,
        "tool_choice": "auto", "tools": [], "status": "completed", "output": [
            {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "let me look", "annotations": [], "logprobs": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{}",
             "status": "completed"}]})
    for dump in ({}, {"by_alias": True}):
        items = [o.model_dump(**dump) for o in r.output]
        assert items[0]["phase"] is None and items[1]["caller"] is None
        body = {"input": [{"role": "user", "content": "hi"}, *items,
                          {"type": "function_call_output", "call_id": "call_1", "output": "ok"}]}
        req = _parse(ResponsesRequest, body)
        assert isinstance(req, ResponsesRequest), (dump, req)
        assert [getattr(i, "type", None) for i in req.input] == \
            ["message", "message", "function_call", "function_call_output"]
    items[0]["phase"] = "final_answer"
    assert isinstance(_parse(ResponsesRequest, {"input": [{"role": "user", "content": "hi"}, items[0]]}),
                      ResponsesRequest)
