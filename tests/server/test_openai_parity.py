"""OpenAI API parity on the real model: the official openai client against a real
``llmserve engine`` serving SmolLM2-135M-Instruct. Structured outputs validate at
temperature 1, tool calls come back (whole and streamed) as OpenAI returns them,
logit_bias and logprobs behave as OpenAI documents, and what is not implemented is
a 400 naming the field. Short schemas and small max_tokens keep this to about a
minute of generation."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.server.harness import start_engine

pytestmark = pytest.mark.real_model
MODEL = "smol"
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"type": "string", "maxLength": 24}},
    "required": ["name", "age", "city"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 32},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 32}},
                   "required": ["timezone"], "additionalProperties": False}}}
ASK_PERSON = [{"role": "user", "content": "Give me a JSON object describing a person: name, age and city."}]
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris right now?"}]


@pytest.fixture(scope="module")
def server(smollm2_path, model_store, tmp_path_factory):
    ep = start_engine(smollm2_path, tmp_path_factory.mktemp("logs"), "--model-store", str(model_store),
                      "--served-model-name", MODEL, "--max-n", "20")
    yield ep
    ep.stop()


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _person_format(strict: bool = True) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": strict}}


def test_twenty_json_schema_answers_at_temperature_1_all_validate(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK_PERSON, response_format=_person_format(),
                                       temperature=1.0, n=20, max_tokens=64, seed=7)
    assert len(r.choices) == 20
    answers = [json.loads(c.message.content) for c in r.choices]  # strict JSON: no raw control characters
    for a, c in zip(answers, r.choices):
        jsonschema.validate(a, PERSON)
        assert c.finish_reason == "stop"
    assert len({json.dumps(a) for a in answers}) > 1  # sampled, not one forced answer


def test_twenty_streamed_json_schema_answers_all_validate(client):
    texts: dict[int, str] = {}
    finish: dict[int, str] = {}
    for chunk in client.chat.completions.create(model=MODEL, messages=ASK_PERSON, response_format=_person_format(),
                                                temperature=1.0, n=20, max_tokens=64, seed=8, stream=True):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert sorted(texts) == list(range(20)) and set(finish.values()) == {"stop"}
    for t in texts.values():
        jsonschema.validate(json.loads(t), PERSON)


def test_json_object_is_a_json_object(client):
    """The request seen failing in issue 22: prose came back."""
    r = client.chat.completions.create(model=MODEL, temperature=1.0, n=4, max_tokens=64, seed=3,
                                       messages=[{"role": "user", "content": "Give me a JSON object with keys "
                                                                             "name and age"}],
                                       response_format={"type": "json_object"})
    for c in r.choices:
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content), dict)


def test_vllm_guided_fields_on_both_endpoints(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Is the sky blue?"}],
                                       max_tokens=8, temperature=1.0, n=4,
                                       extra_body={"guided_choice": ["yes", "no"]})
    assert {c.message.content for c in r.choices} <= {"yes", "no"}
    r = client.completions.create(model=MODEL, prompt="A phone number: ", max_tokens=16, temperature=1.0,
                                  extra_body={"structured_outputs": {"regex": r"\d{3}-\d{4}"}})
    import re
    assert re.fullmatch(r"\d{3}-\d{4}", r.choices[0].text)


def _check_call(call, fn: dict) -> None:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == fn["function"]["name"]
    jsonschema.validate(json.loads(call.function.arguments), fn["function"]["parameters"])


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_call_matches_the_schema(client, choice):
    r = client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=[TIME, WEATHER], tool_choice=choice,
                                       parallel_tool_calls=False, temperature=1.0, n=3, max_tokens=80, seed=1)
    for c in r.choices:
        assert c.finish_reason == ("tool_calls" if choice == "required" else "stop") and c.message.content is None
        assert len(c.message.tool_calls) == 1
        fn = WEATHER if c.message.tool_calls[0].function.name == "get_weather" else TIME
        _check_call(c.message.tool_calls[0], fn if choice == "required" else WEATHER)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_call_streamed_as_openai_streams_it(client, choice):
    calls: dict[int, dict] = {}
    finish = None
    first_delta = None
    for chunk in client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER],
                                                tool_choice=choice, parallel_tool_calls=False, temperature=1.0,
                                                max_tokens=80, seed=2, stream=True):
        c = chunk.choices[0]
        first_delta = first_delta or c.delta
        for d in c.delta.tool_calls or []:
            if d.id:  # the first piece of a call: id, type and name, then arguments in pieces
                assert d.type == "function" and d.function.name and d.index not in calls
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": d.function.arguments or ""}
            else:
                assert d.function.name is None
                calls[d.index]["arguments"] += d.function.arguments
        finish = c.finish_reason or finish
    named = choice != "required"  # (OpenAI's and vLLM's finish reason for a named choice: stop)
    assert first_delta.role == "assistant" and finish == ("stop" if named else "tool_calls") and list(calls) == [0]
    assert calls[0]["name"] == "get_weather"
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER["function"]["parameters"])


def test_tool_results_are_accepted_in_the_next_turn(client):
    msgs = ASK_WEATHER + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18, "sky": "clear"}'}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, tools=[WEATHER], tool_choice="none",
                                       temperature=0, max_tokens=24)
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason in ("stop", "length")


def test_logit_bias_and_logprobs_as_openai_shapes_them(client, server):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Say hello."}], temperature=0, max_tokens=6)
    r = client.chat.completions.create(**kw, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert bytes(b for e in content for b in e.bytes).decode() == r.choices[0].message.content
    ended = client.chat.completions.create(**{**kw, "max_tokens": 64}, logprobs=True,
                                           extra_body={"guided_choice": ["Hello!"]})
    assert ended.choices[0].finish_reason == "stop"  # by the stop token, which has no text and no logprob
    assert "".join(e.token for e in ended.choices[0].logprobs.content) == "Hello!"
    assert all(len(e.top_logprobs) == 3 and e.logprob == pytest.approx(e.top_logprobs[0].logprob) for e in content)
    first = httpx.post(server.url + "/tokenize", json={"prompt": content[0].token, "add_special_tokens": False},
                       timeout=30).json()["tokens"][0]
    banned = client.chat.completions.create(**kw, logprobs=True, logit_bias={str(first): -100})
    assert banned.choices[0].logprobs.content[0].token != content[0].token
    c = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0,
                                  logprobs=2)
    lp = c.choices[0].logprobs
    assert "".join(lp.tokens) == c.choices[0].text and len(lp.token_logprobs) == 4
    assert all(t in top and len(top) <= 3 for t, top in zip(lp.tokens, lp.top_logprobs))
    assert lp.text_offset[0] == 0


def test_best_of_returns_the_most_likely_and_echo_prepends_the_prompt(client):
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=1.0,
                                  best_of=4, n=2, seed=5, logprobs=0)
    assert len(r.choices) == 2 and r.usage.completion_tokens > sum(len(c.logprobs.tokens) for c in r.choices)
    means = [sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs) for c in r.choices]
    assert means[0] >= means[1]
    e = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4, temperature=0, echo=True)
    assert e.choices[0].text.startswith("Once upon a time") and len(e.choices[0].text) > len("Once upon a time")


@pytest.mark.parametrize("extra,param", [
    ({"functions": [{"name": "f"}]}, "functions"), ({"suffix": "x"}, "suffix"), ({"frobnicate": 1}, "frobnicate"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format.json_schema.schema"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
])
def test_unsupported_or_malformed_fields_are_a_400_naming_the_field(client, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ASK_PERSON, max_tokens=4, extra_body=extra)
    assert e.value.body["param"] == param
