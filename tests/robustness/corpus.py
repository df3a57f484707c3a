"""Bad and edge-case requests, by category. Every one must get an OpenAI error JSON with
a 4xx (or, for the edge cases that are valid, a 200): never a 5xx, never a reset.

Built from the categories seen to break servers: poison values that pass a naive
range check, text that is not text, numbers past what a parser or torch takes,
shapes OpenAI does not define, fields nobody implements, and sizes past the caps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    body: bytes
    expect: frozenset[int] = frozenset({400})
    headers: dict[str, str] = field(default_factory=dict)
    method: str = "POST"


def _chat(name: str, expect=frozenset({400}), **fields) -> Case:
    body = {"model": "tiny", "messages": MSG, "max_tokens": 2, **fields}
    return Case(f"chat:{name}", CHAT, json.dumps(body).encode(), frozenset(expect))


def _comp(name: str, expect=frozenset({400}), **fields) -> Case:
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2, **fields}
    return Case(f"completions:{name}", COMPLETIONS, json.dumps(body).encode(), frozenset(expect))


def _raw(name: str, raw: bytes, path: str = CHAT, expect=frozenset({400}), **kw) -> Case:
    return Case(f"raw:{name}", path, raw, frozenset(expect), **kw)


def _messages(name: str, messages, expect=frozenset({400})) -> Case:
    body = {"model": "tiny", "messages": messages, "max_tokens": 2}
    return Case(f"messages:{name}", CHAT, json.dumps(body).encode(), frozenset(expect))



# Out-of-range and wrong-typed values for every sampling field, for both endpoints.
_BAD_FIELDS: dict[str, list] = {
    "temperature": [-1, 2.5, 1e308, "hot", [1]],
    "top_p": [0, -0.1, 1.5, -1],
    "presence_penalty": [3, -3, 1e300],
    "frequency_penalty": [2.1, -1e300],
    "repetition_penalty": [1e-300, 0, -1, 1e300, 5e-324],
    "min_p": [-0.5, 2],
    "top_k": [-2, 2**40, "many"],
    "n": [0, -1, 10_000, 1.5],
    "max_tokens": [0, -5, 2**40, "lots"],
    "seed": [-(2**63) - 1, 2**64, "s", 1.5],
    "stop": [[""], ["x" * 300], ["s"] * 17, [1, 2], {"a": 1}],
    "stop_token_ids": [[-1], [2**31], list(range(300)), ["a"]],
    "priority": ["urgent", "9" * 5000, 1.5, [1]],
    "cache_salt": ["", "s" * 300, 5],
    "user": ["u" * 300, 12],
    "model": [5, "m" * 300],
    "stream": [[True], {"a": 1}],
    "stream_options": [{"include_usage": True, "extra": 1}, "yes"],
    "store": [True],
    "service_tier": ["flex"],
    "best_of": [0, 200, "x"],
    # Malformed constraints and biases (implemented fields, bad values).
    "logit_bias": [{"a": 1}, {"-1": 1}, {"1": 101}, {"1": -100.5}, {"99999999999": 1}, {"1": "x"}, [1],
                   {str(i): 1 for i in range(1100)}, {"100000": 1}],
    "response_format": [{"type": "xml"}, "json", {"type": "json_schema"},
                        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}},
                        {"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}},
                        {"type": "json_schema", "json_schema": {"schema": {}}},
                        {"type": "json_object", "extra": 1},
                        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"properties": 5}}}],
    "guided_json": ["{not json", 5, {"type": 7}, {"required": "name"}],
    "guided_regex": ["", "(unclosed", 5],
    "guided_choice": [[], [""], "yes"],
    "guided_grammar": ["", "root ::= undefined_rule"],
    "structured_outputs": [{}, {"regex": "a", "choice": ["b"]}, {"unknown": 1}, {"json": "nope"}],
}
_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                         "required": ["city"]}}}
_UNSUPPORTED = {
    "functions": [{"name": "f"}], "function_call": "auto", "suffix": "end", "audio": {"voice": "x"},
    "prediction": {"type": "content", "content": "x"}, "frobnicate": 1, "reasoning_effort": "low",
    "web_search_options": {}, "prompt_logprobs": 1, "guided_decoding_backend": "outlines",
}

CASES: list[Case] = []
for fname, values in _BAD_FIELDS.items():
    for i, v in enumerate(values):
        CASES.append(_chat(f"{fname}[{i}]", **{fname: v}))
        if fname not in ("stream_options",):
            CASES.append(_comp(f"{fname}[{i}]", **{fname: v}))
for fname, v in _UNSUPPORTED.items():
    CASES.append(_chat(f"unsupported:{fname}", **{fname: v}))
CASES += [
    _chat("tools:no name", tools=[{"type": "function", "function": {}}]),
    _chat("tools:bad name", tools=[{"type": "function", "function": {"name": "get weather"}}]),
    _chat("tools:not a function", tools=[{"type": "code_interpreter"}]),
    _chat("tools:bad parameters", tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]),
    _chat("tools:empty", tools=[]),
    _chat("tools:duplicate names", tools=[_TOOL, _TOOL]),
    _chat("tools:129", tools=[{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]),
    _chat("tools:string", tools="get_weather"),
    _chat("tool_choice:without tools", tool_choice="auto"),
    _chat("tool_choice:unknown mode", tools=[_TOOL], tool_choice="sometimes"),
    _chat("tool_choice:unknown function", tools=[_TOOL], tool_choice={"type": "function", "function": {"name": "g"}}),
    _chat("tool_choice:no function", tools=[_TOOL], tool_choice={"type": "function"}),
    _chat("tools with response_format", tools=[_TOOL], response_format={"type": "json_object"}),
    _chat("parallel_tool_calls:string", tools=[_TOOL], parallel_tool_calls="maybe"),
    _chat("two constraints", response_format={"type": "json_object"}, guided_regex="a+"),
    _chat("best_of below n", n=3, best_of=2),
    _chat("best_of streamed", best_of=2, stream=True),
    _comp("echo with logprobs", echo=True, logprobs=1),
    _messages("tool without tool_call_id", [{"role": "tool", "content": "12C"}]),
    _messages("tool_call_id on a user", [{"role": "user", "content": "hi", "tool_call_id": "c1"}]),
    _messages("tool_calls on a user", [{"role": "user", "content": "hi", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]),
    _messages("tool_calls no arguments", [{"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f"}}]}]),
    _messages("tool_calls empty", [{"role": "assistant", "tool_calls": []}]),
    _messages("tool_calls arguments object", [{"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"city": "x"}}}]}]),
    _messages("function role", [{"role": "function", "name": "f", "content": "x"}]),
    _chat("top_logprobs", logprobs=True, top_logprobs=50),
    # Fields that would change nothing are refused, as OpenAI and vLLM refuse them (issue 28).
    _chat("top_logprobs without logprobs", top_logprobs=2),
    _chat("top_logprobs with logprobs false", logprobs=False, top_logprobs=0),
    _chat("stream_options without stream", stream_options={"include_usage": True}),
    _comp("stream_options without stream", stream_options={"include_usage": True}),
    _chat("stream_options with stream false", stream=False, stream_options={"include_usage": False}),
    _chat("parallel_tool_calls without tools", parallel_tool_calls=False),
    _chat("modalities:audio", modalities=["audio"]),
    _comp("logprobs:21", logprobs=21),
    _comp("logprobs:-1", logprobs=-1),
    _chat("seed:max with n=2", seed=2**64 - 1, n=2, expect={200}),
    _comp("prompt:empty string", prompt=""),
    _comp("prompt:empty list", prompt=[]),
    _comp("prompt:empty inner", prompt=[[]]),
    _comp("prompt:negative id", prompt=[-1, 2]),
    _comp("prompt:huge id", prompt=[10**30]),
    _comp("prompt:id past vocab", prompt=[10**6]),
    _comp("prompt:mixed", prompt=["a", 1]),
    _comp("prompt:dict", prompt={"text": "a"}),
    _comp("prompt:null", prompt=None),
    _comp("prompt:lone surrogate", prompt="\ud800"),
    _comp("prompt:2000 prompts", prompt=["a"] * 2000),
    _chat("cache_salt:lone surrogate", cache_salt="\udfff"),
    _chat("user:lone surrogate", user="\ud800x"),
    _chat("model:lone surrogate", model="\ud800"),
    _chat("stop:lone surrogate", stop=["\ud800"]),
    _chat("metadata:too many", metadata={f"k{i}": "v" for i in range(40)}),
    _chat("metadata:non-string", metadata={"k": 1}),
    _messages("text int", [{"role": "user", "content": [{"type": "text", "text": 5}]}]),
    _messages("text null", [{"role": "user", "content": [{"type": "text", "text": None}]}]),
    _messages("part without type", [{"role": "user", "content": [{"text": "a"}]}]),
    _messages("part not a dict", [{"role": "user", "content": ["a"]}]),
    _messages("image part", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
    _messages("audio part", [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]),
    _messages("unknown role", [{"role": "wizard", "content": "hi"}]),
    _messages("no role", [{"content": "hi"}]),
    _messages("user content null", [{"role": "user", "content": None}]),
    _messages("user without content", [{"role": "user"}]),
    _messages("role int", [{"role": 1, "content": "hi"}]),
    _messages("content int", [{"role": "user", "content": 5}]),
    _messages("content dict", [{"role": "user", "content": {"a": 1}}]),
    _messages("content lone surrogate", [{"role": "user", "content": "\udc00"}]),
    _messages("key lone surrogate", [{"role": "user", "content": "hi", "\ud800": 1}]),
    _messages("extra message field", [{"role": "user", "content": "hi", "color": "red"}]),
    _messages("empty", []),
    _messages("not a list", "hi"),
    _messages("message not a dict", ["hi"]),
    _messages("too many", [{"role": "user", "content": "hi"}] * 1100),
    _messages("too many parts", [{"role": "user", "content": [{"type": "text", "text": "a"}] * 300}]),
    _messages("name too long", [{"role": "user", "content": "hi", "name": "n" * 100}]),
    _raw("not json", b"{not json"),
    _raw("truncated", b'{"model": "tiny",'),
    _raw("empty body", b""),
    _raw("array", b"[1, 2]"),
    _raw("string", b'"hello"'),
    _raw("null", b"null"),
    _raw("number", b"5"),
    _raw("nested 100k", b"[" * 100_000 + b"]" * 100_000),
    _raw("nested 100k in field", b'{"model":"tiny","messages":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    _raw("nested 40", b'{"model":"tiny","messages":[{"role":"user","content":"hi"}],"x":'
         + b"[" * 40 + b"]" * 40 + b"}"),
    _raw("5000-digit int", b'{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":'
         + b"9" * 5000 + b"}"),
    _raw("5000-digit priority", b'{"model":"tiny","messages":[{"role":"user","content":"hi"}],"priority":'
         + b"9" * 5000 + b"}"),
    _raw("NaN", b'{"model":"tiny","messages":[{"role":"user","content":"hi"}],"temperature":NaN}'),
    _raw("Infinity", b'{"model":"tiny","messages":[{"role":"user","content":"hi"}],"top_p":Infinity}'),
    _raw("-Infinity", b'{"model":"tiny","prompt":"hi","presence_penalty":-Infinity}', COMPLETIONS),
    _raw("invalid utf-8", b'{"model":"tiny","messages":[{"role":"user","content":"\xff\xfe"}]}'),
    _raw("latin-1 body", '{"model":"tiny","prompt":"café"}'.encode("latin-1"), COMPLETIONS),
    _raw("utf-16 body", '{"model":"tiny","prompt":"hi"}'.encode("utf-16"), COMPLETIONS),
    _raw("nul bytes", b'\x00\x00\x00'),
    _raw("x-priority 5000 digits", json.dumps({"model": "tiny", "messages": MSG, "max_tokens": 2}).encode(),
         headers={"x-priority": "9" * 5000}),
    _raw("x-priority word", json.dumps({"model": "tiny", "messages": MSG, "max_tokens": 2}).encode(),
         headers={"x-priority": "urgent"}),
    _raw("GET completions", b"", COMPLETIONS, expect={405}, method="GET"),
    _raw("unknown path", b"{}", "/v1/nothing", expect={404}),
    # Valid edge cases: must be served.
    _messages("surrogate pair escape", [{"role": "user", "content": "\U0001F600 caf\u00e9"}], expect={200}),
    _messages("text parts", [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                          {"type": "text", "text": "b"}]}], expect={200}),
    _messages("developer role", [{"role": "developer", "content": "be brief"},
                                 {"role": "user", "content": "hi"}], expect={200}),
    _comp("token ids", prompt=[5, 6, 7], expect={200}),
    _chat("store false and metadata", store=False, metadata={"k": "v"}, expect={200}),
    _chat("top_k -1", top_k=-1, expect={200}),
    _chat("stop 16", stop=[f"s{i}" for i in range(16)], expect={200}),
    _chat("logit_bias", logit_bias={"1": 5, "7": -100}, expect={200}),
    _chat("response_format json_object", response_format={"type": "json_object"}, expect={200}),
    _chat("response_format text", response_format={"type": "text"}, expect={200}),
    _chat("guided_json any", guided_json={}, expect={200}),
    _comp("guided_choice", guided_choice=["a", "b"], expect={200}),
    _chat("tools auto", tools=[_TOOL], expect={200}),
    _chat("tools required, one call", tools=[_TOOL], tool_choice="required", parallel_tool_calls=False,
          expect={200}),
    _messages("a tool call and its result", [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "12C"}], expect={200}),
    _comp("best_of", best_of=3, expect={200}),
    _comp("echo", echo=True, expect={200}),
]
# Instance-only endpoints.
INSTANCE_CASES: list[Case] = [
    _raw("detokenize huge id", b'{"tokens":[' + str(10**30).encode() + b"]}", "/detokenize"),
    _raw("detokenize negative", b'{"tokens":[-1]}', "/detokenize"),
    _raw("detokenize past vocab", b'{"tokens":[100000]}', "/detokenize"),
    _raw("detokenize string", b'{"tokens":["a"]}', "/detokenize"),
    _raw("tokenize nothing", b"{}", "/tokenize"),
    _raw("tokenize bad message", b'{"messages":[{"role":"user","content":[{"type":"text","text":1}]}]}',
         "/tokenize"),
    _raw("tokenize lone surrogate", b'{"prompt":"\\ud800"}', "/tokenize"),
    _raw("tokenize ok", b'{"prompt":"hello"}', "/tokenize", expect={200}),
]
