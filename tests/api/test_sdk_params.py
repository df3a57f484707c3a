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
