"""The Hermes tool-call format: prompt rendering, the grammar a request gets, and the
parser, whole and streamed in any chunking (pure code, no server)."""

from __future__ import annotations

import json
import random

import pytest

from llmserve.api.parse import validate
from llmserve.api.protocol import ChatCompletionRequest, CompletionRequest
from llmserve.server.constraints import structured_outputs
from llmserve.server.tool_calls import (CallArguments, CallStart, Content, ToolCallParser, call_grammar,
                                        render_messages)

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
OUT = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris, \\"FR\\"", '
       '"nested": {"a": [1, {"b": "}"}]}}}\n</tool_call>\n<tool_call>\n{"arguments": {"x": 1}, "name": "g"}\n'
       '</tool_call>')


def _ids():
    n = iter(range(100))
    return lambda: f"call_{next(n)}"


def _parse_in_chunks(text: str, seed: int | None, **kw) -> tuple[ToolCallParser, list]:
    p = ToolCallParser(new_id=_ids(), **kw)
    if seed is None:
        return p, p.feed(text) + p.finish()
    rng, events, i = random.Random(seed), [], 0
    while i < len(text):
        k = rng.randint(1, 7)
        events += p.feed(text[i:i + k])
        i += k
    return p, events + p.finish()


def test_calls_are_parsed_with_arguments_exactly_as_written():
    p, events = _parse_in_chunks(OUT, None)
    assert p.content == "Let me check.\n"
    assert p.tool_calls() == [
        {"id": "call_0", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris, \\"FR\\"", "nested": {"a": [1, {"b": "}"}]}}'}},
        {"id": "call_1", "type": "function", "function": {"name": "g", "arguments": '{"x": 1}'}}]
    assert isinstance(events[0], Content) and isinstance(events[1], CallStart)


@pytest.mark.parametrize("seed", range(40))
def test_any_chunking_streams_the_same_calls_and_pieces_join_to_the_arguments(seed):
    whole, _ = _parse_in_chunks(OUT, None)
    p, events = _parse_in_chunks(OUT, seed)
    assert p.tool_calls() == whole.tool_calls() and p.content == whole.content
    args: dict[int, str] = {}
    for e in events:
        if isinstance(e, CallArguments):
            args[e.index] = args.get(e.index, "") + e.text
    assert [args[i] for i in sorted(args)] == [c["function"]["arguments"] for c in whole.tool_calls()]
    starts = [e for e in events if isinstance(e, CallStart)]
    assert [e.index for e in starts] == [0, 1]
    # the name is sent before any of its arguments
    first_args = next(i for i, e in enumerate(events) if isinstance(e, CallArguments))
    assert events.index(starts[0]) < first_args


def test_partial_tag_is_held_back_then_released_as_content():
    p = ToolCallParser(new_id=_ids())
    assert p.feed("a <tool") == [Content("a ")]
    assert p.feed("box> b") == [Content("<toolbox> b")]
    assert p.finish() == [] and p.tool_calls() == []


def test_parallel_off_keeps_the_first_call_only_and_a_cut_call_keeps_what_it_got():
    p, _ = _parse_in_chunks(OUT, 3, parallel=False)
    assert [c["function"]["name"] for c in p.tool_calls()] == ["get_weather"]
    cut, _ = _parse_in_chunks('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', 1)
    assert cut.tool_calls()[0]["function"]["arguments"] == '{"city": "Par'


def test_a_block_that_is_not_a_call_is_content():
    p, _ = _parse_in_chunks("<tool_call>not json</tool_call>", 2)
    assert p.tool_calls() == [] and p.content == "<tool_call>not json</tool_call>"


def test_render_puts_tools_in_the_system_message_and_calls_and_results_as_text():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "18C"},
            {"role": "tool", "tool_call_id": "c2", "content": "rain"}]
    out = render_messages(msgs, [TOOL])
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\n# Tools") and json.dumps(TOOL) in out[0]["content"]
    assert out[2]["content"] == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert out[3]["content"] == "<tool_response>\n18C\n</tool_response>\n<tool_response>\nrain\n</tool_response>"
    assert render_messages(msgs[1:2], None) == msgs[1:2]


def _chat(**kw) -> ChatCompletionRequest:
    return validate({"messages": [{"role": "user", "content": "hi"}], **kw}, ChatCompletionRequest)


def test_each_field_gives_its_constraint():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    assert structured_outputs(_chat(response_format=fmt)).json == schema
    assert structured_outputs(_chat(response_format={"type": "json_object"})).json_object
    assert structured_outputs(_chat(response_format={"type": "text"})) is None
    assert structured_outputs(_chat(guided_json=json.dumps(schema))).json == schema
    assert structured_outputs(_chat(guided_choice=["a"])).choice == ["a"]
    assert structured_outputs(_chat(structured_outputs={"grammar": "root ::= \"a\""})).grammar == 'root ::= "a"'
    comp = validate({"prompt": "x", "guided_regex": "a+"}, CompletionRequest)
    assert structured_outputs(comp).regex == "a+"
    assert structured_outputs(_chat(tools=[TOOL])).structural_tag["format"]["type"] == "triggered_tags"
    assert structured_outputs(_chat(tools=[TOOL], tool_choice="none")) is None
    named = structured_outputs(_chat(tools=[TOOL, {"type": "function", "function": {"name": "other"}}],
                                     tool_choice={"type": "function", "function": {"name": "other"}}))
    tags = named.structural_tag["format"]["tags"]
    assert [t["content"]["json_schema"]["properties"]["name"] for t in tags] == [{"const": "other"}]


@pytest.mark.parametrize("mode,parallel,fmt,stop_after_first", [
    ("auto", True, "triggered_tags", False), ("required", True, "tags_with_separator", False),
    ("required", False, "tags_with_separator", True), ("named", True, "tags_with_separator", True)])
def test_call_grammar(mode, parallel, fmt, stop_after_first):
    g = call_grammar([TOOL], mode, parallel)["format"]
    assert g["type"] == fmt and g["stop_after_first"] is stop_after_first
    assert g.get("at_least_one") is (mode != "auto")
    assert call_grammar([TOOL], "none", parallel) is None
