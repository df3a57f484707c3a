"""The Hermes tool-call format: prompt rendering and the grammar a request gets
(tool_calls.py, constraints.py). Pure code, no server."""

from __future__ import annotations

import json

import pytest

from llmserve.api.parse import validate
from llmserve.api.protocol import ChatCompletionRequest, CompletionRequest
from llmserve.server.constraints import structured_outputs
from llmserve.server.tool_calls import call_grammar, render_messages

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


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


def test_parameters_with_defs_and_refs_compile_and_constrain_the_call():
    """pydantic's nested models (openai.pydantic_function_tool) name them as ``#/$defs/X``; the
    parameters sit under ``arguments`` in the call's schema, so those names must still resolve."""
    from tokenizers import Tokenizer as RustTokenizer

    from llmserve.engine.grammar import GrammarBackend
    from llmserve.engine.sampling_params import StructuredOutputsParams
    from llmserve.models.tokenizer import Tokenizer
    from tests.helpers import tiny_tokenizer_json

    params = {"type": "object", "required": ["item", "tags"], "additionalProperties": False, "properties": {
        "item": {"$ref": "#/$defs/Item"}, "tags": {"type": "array", "items": {"$ref": "#/properties/tag"}},
        "tag": {"type": "string", "enum": ["x", "y"]}},
        "$defs": {"Item": {"type": "object", "required": ["qty"], "additionalProperties": False,
                           "properties": {"qty": {"type": "integer"}, "next": {"$ref": "#/$defs/Item"}}}}}
    tool = {"type": "function", "function": {"name": "order", "parameters": params}}
    tok = Tokenizer(RustTokenizer.from_str(tiny_tokenizer_json(384)), bos_token="<|im_start|>",
                    eos_token="<|im_end|>")
    backend = GrammarBackend(tok, 384, [2])
    compiled = backend.compile(StructuredOutputsParams(structural_tag=json.dumps(call_grammar([tool], "required",
                                                                                             False))))

    def accepts(arguments: str) -> bool:
        m = backend.matcher(compiled)
        return m.accept_string(f'<tool_call>\n{{"name": "order", "arguments": {arguments}}}\n</tool_call>')

    assert accepts('{"item": {"qty": 2, "next": {"qty": 1}}, "tags": ["x"]}')
    assert not accepts('{"item": {"qty": "two"}, "tags": ["x"]}')  # the $defs type holds
    assert not accepts('{"item": {"qty": 2}, "tags": ["z"]}')  # and the moved local reference
