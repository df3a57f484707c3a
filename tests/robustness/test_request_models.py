"""Property tests of the shared request models: any body gives a typed request or an
OpenAI 400, never another exception; what they accept the engine accepts."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmserve.api.errors import APIError
from llmserve.api.parse import parse_model
from llmserve.api.protocol import ChatCompletionRequest, CompletionRequest, TokenizeRequest
from llmserve.engine.sampling_params import InvalidParameterError, SamplingParams

MODELS = (ChatCompletionRequest, CompletionRequest, TokenizeRequest)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=30)


def _fields(model) -> st.SearchStrategy[dict]:
    names = st.sampled_from(sorted(model.model_fields) + ["bogus"])
    return st.dictionaries(names, json_values, max_size=8)


def _outcome(raw: bytes, model):
    try:
        return parse_model(raw, model)
    except APIError as e:
        assert e.status == 400 and e.message
        return e


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(MODELS), body=json_values)
def test_any_json_is_a_request_or_a_400(model, body):
    _outcome(json.dumps(body).encode(), model)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(MODELS), body=st.data())
def test_any_mix_of_known_fields_is_a_request_or_a_400(model, body):
    fields = body.draw(_fields(model))
    _outcome(json.dumps(fields).encode(), model)


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=64))
def test_any_bytes_are_a_request_or_a_400(raw):
    _outcome(raw, ChatCompletionRequest)


@settings(max_examples=300, deadline=None)
@given(temperature=st.floats(0, 2), top_p=st.floats(0, 1, exclude_min=True),
       presence=st.floats(-2, 2), frequency=st.floats(-2, 2),
       repetition=st.floats(0.01, 100), min_p=st.floats(0, 1),
       seed=st.integers(-(2**63), 2**64 - 1) | st.none(), n=st.integers(1, 8),
       top_k=st.integers(-1, 10**6),
       bias=st.dictionaries(st.integers(0, 2**31 - 1).map(str), st.floats(-100, 100), max_size=4))
def test_what_the_edge_accepts_the_engine_accepts(temperature, top_p, presence, frequency, repetition,
                                                  min_p, seed, n, top_k, bias):
    body = {"prompt": "hi", "temperature": temperature, "top_p": top_p, "presence_penalty": presence,
            "frequency_penalty": frequency, "repetition_penalty": repetition, "min_p": min_p,
            "seed": seed, "n": n, "top_k": top_k, "logit_bias": bias}
    r = parse_model(json.dumps(body).encode(), CompletionRequest)
    try:
        SamplingParams(n=r.n, max_tokens=4, temperature=r.temperature, top_p=r.top_p,
                       top_k=max(0, r.top_k), min_p=r.min_p, seed=r.seed,
                       presence_penalty=r.presence_penalty, frequency_penalty=r.frequency_penalty,
                       repetition_penalty=r.repetition_penalty,
                       logit_bias={int(k): v for k, v in r.logit_bias.items()} if r.logit_bias else None)
    except InvalidParameterError as e:  # pragma: no cover - the failure this test exists for
        raise AssertionError(f"the edge accepted what the engine refuses: {e}") from None


def test_the_api_doc_lists_every_field():
    """docs/openai-api.md is the allowlist: every accepted field, every no-op and every
    field refused by name appears in it (a new field without a line there fails)."""
    import re
    from pathlib import Path

    from llmserve.api.protocol import NO_OP, UNSUPPORTED, ChatMessage

    doc = (Path(__file__).resolve().parents[2] / "docs" / "openai-api.md").read_text()
    named = set(re.findall(r"`([a-z_\[\].]+)`", doc))
    fields = {f.alias or n for m in (ChatCompletionRequest, CompletionRequest) for n, f in m.model_fields.items()}
    fields |= {f"messages[].{n}" for n in ChatMessage.model_fields if n not in ("role", "content")}
    missing = sorted((fields | set(UNSUPPORTED) | set(NO_OP)) - named)
    assert not missing, f"not in docs/openai-api.md: {missing}"


def test_refusals_name_the_field_the_client_wrote_not_the_models_classes():
    """A bad ``tool_choice`` names ``tool_choice`` (and what it may be), a member's field its
    path without the union's class names; a user turn with no content is refused as OpenAI does."""
    tools = [{"type": "function", "function": {"name": "f"}}]

    def refusal(**fields) -> APIError:
        body = {"messages": [{"role": "user", "content": "hi"}], "tools": tools, **fields}
        e = _outcome(json.dumps(body).encode(), ChatCompletionRequest)
        assert isinstance(e, APIError), fields
        return e

    for choice in ("bogus", 5, ["auto"]):
        e = refusal(tool_choice=choice)
        assert e.param == "tool_choice" and "'required'" in e.message, (choice, e.param, e.message)
    assert refusal(tool_choice={"type": "function"}).param == "tool_choice.function"
    for message in ({"role": "user", "content": None}, {"role": "system"}, {"role": "user", "content": []}):
        assert refusal(messages=[message]).param == "messages[0].content", message
    ok = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "1", "tool_call_id": "c"}], "tools": tools, "tool_choice": "auto"}
    assert isinstance(_outcome(json.dumps(ok).encode(), ChatCompletionRequest), ChatCompletionRequest)


def test_null_is_a_field_not_given_and_types_are_strict():
    """OpenAI's nullable fields sent as null read as absent (as vLLM reads them), the fields
    refused by name included; a number in a string, or a boolean where an integer goes, is
    refused rather than coerced ("5" -> 5, true -> token id 1)."""
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    nulls = {"n": None, "logprobs": None, "frequency_penalty": None, "presence_penalty": None, "stop": None,
             "seed": None, "functions": None, "function_call": None, "audio": None, "prediction": None}
    got = _outcome(json.dumps({**chat, **nulls}).encode(), ChatCompletionRequest)
    assert got == _outcome(json.dumps(chat).encode(), ChatCompletionRequest)
    comp = {"prompt": "x"}
    got = _outcome(json.dumps({**comp, "echo": None, "suffix": None, "logprobs": None}).encode(), CompletionRequest)
    assert got == _outcome(json.dumps(comp).encode(), CompletionRequest)
    for model, body, param in ((CompletionRequest, {**comp, "max_tokens": "5"}, "max_tokens"),
                               (CompletionRequest, {"prompt": [True]}, "prompt"),
                               (CompletionRequest, {**comp, "logprobs": True}, "logprobs"),
                               (ChatCompletionRequest, {**chat, "temperature": "0.5"}, "temperature"),
                               (ChatCompletionRequest, {**chat, "n": 2.0}, "n")):
        e = _outcome(json.dumps(body).encode(), model)
        assert isinstance(e, APIError) and e.param is not None and e.param.startswith(param), (body, e)
    # ... and "suffix" with a value is still refused by name
    e = _outcome(json.dumps({**comp, "suffix": "y"}).encode(), CompletionRequest)
    assert isinstance(e, APIError) and e.code == "unsupported_parameter"


def test_a_unions_refusal_names_the_broken_bound_not_another_members_type():
    comp = {"prompt": "x"}
    for body, param, says in (({**comp, "stop": [f"s{i}" for i in range(17)]}, "stop", "at most 16"),
                              ({"prompt": [-1]}, "prompt[0]", "greater than or equal to 0"),
                              ({"prompt": []}, "prompt", "at least 1")):
        e = _outcome(json.dumps(body).encode(), CompletionRequest)
        assert isinstance(e, APIError) and e.param == param and says in e.message, (body, e.param, e.message)
        assert e.code == "invalid_value"
