"""Golden outputs of the tool-call and reasoning parsers, whole and streamed (every split of
the text into pieces gives the same events joined), including parses that fail mid-tag."""

from __future__ import annotations

import itertools

import pytest

from llmserve.server.reasoning_parser import Reasoning, ReasoningParser
from llmserve.server.tool_formats import parser_for_template, tool_call_parser
from llmserve.server.tool_parser import CallArguments, CallStart, Content

PARIS = '{"city": "Paris"}'
ROME = '{"city": "Rome"}'


def _ids():
    n = itertools.count()
    return lambda: f"call_{next(n)}"


def _run(name: str, pieces: list[str], parallel: bool = True):
    p = tool_call_parser(name, parallel)
    p.new_id = _ids()
    events = [e for piece in pieces for e in p.feed(piece)] + p.finish()
    content = "".join(e.text for e in events if isinstance(e, Content))
    calls: dict[int, list[str]] = {}
    for e in events:
        if isinstance(e, CallStart):
            calls[e.index] = [e.name, ""]
        elif isinstance(e, CallArguments):
            calls[e.index][1] += e.text
    return content, [tuple(v) for _, v in sorted(calls.items())], p.tool_calls()


def _splits(text: str):
    """The text whole, a character at a time, and in pieces of 3 and 7."""
    yield [text]
    yield list(text)
    for k in (3, 7):
        yield [text[i:i + k] for i in range(0, len(text), k)]


GOLDEN = [
    ("hermes", f'Let me check.<tool_call>\n{{"name": "get_weather", "arguments": {PARIS}}}\n</tool_call>',
     "Let me check.", [("get_weather", PARIS)]),
    ("llama3_json", f'{{"name": "get_weather", "parameters": {PARIS}}}; {{"name": "get_weather", "parameters": {ROME}}}',
     "", [("get_weather", PARIS), ("get_weather", ROME)]),
    ("llama3_json", f'<|python_tag|>{{"name": "get_weather", "parameters": {PARIS}}}', "", [("get_weather", PARIS)]),
    ("llama3_json", "It is sunny {probably}.", "It is sunny {probably}.", []),
    ("mistral", f'Sure.[TOOL_CALLS][{{"name": "get_weather", "arguments": {PARIS}}}, '
                f'{{"name": "get_weather", "arguments": {ROME}}}]', "Sure.", [("get_weather", PARIS), ("get_weather", ROME)]),
    ("mistral", f"[TOOL_CALLS]get_weather[ARGS]{PARIS}[TOOL_CALLS]get_weather[ARGS]{ROME}", "",
     [("get_weather", PARIS), ("get_weather", ROME)]),
    ("mistral", "No tools needed [TOOL", "No tools needed [TOOL", []),  # fails mid-tag: text
    # v13 tokenizers write the call's id; one call object instead of a list (vLLM reads both)
    ("mistral", f"[TOOL_CALLS]get_weather[CALL_ID]abc123XYZ[ARGS]{PARIS}[TOOL_CALLS]get_weather[CALL_ID]Q1w2E3r4T[ARGS]{ROME}",
     "", [("get_weather", PARIS), ("get_weather", ROME)]),
    ("mistral", f'Sure. [TOOL_CALLS] {{"name": "get_weather", "arguments": {PARIS}}}', "Sure. ", [("get_weather", PARIS)]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Pa', '{"name": "get_weather", "parameters": {"city": "Pa', []),  # cut short
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "argu', '[TOOL_CALLS][{"name": "get_weather", "argu', []),
]


@pytest.mark.parametrize("name,text,content,calls", GOLDEN)
def test_tool_call_golden(name, text, content, calls):
    for pieces in _splits(text):
        got_content, got_calls, whole = _run(name, pieces)
        assert (got_content, got_calls) == (content, calls), pieces
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in whole] == calls


def test_a_mistral_call_id_the_model_wrote_is_the_call_s_id():
    """The next turn's tool result names the call by that id, and the template checks it."""
    text = f"[TOOL_CALLS]get_weather[CALL_ID]abc123XYZ[ARGS]{PARIS}[TOOL_CALLS]get_time[ARGS]{{}}"
    for pieces in _splits(text):
        p = tool_call_parser("mistral")
        events = [e for piece in pieces for e in p.feed(piece)] + p.finish()
        assert [(e.id, e.name) for e in events if isinstance(e, CallStart)] == \
            [("abc123XYZ", "get_weather"), (p.tool_calls()[1]["id"], "get_time")]
        assert [c["id"] for c in p.tool_calls()][0] == "abc123XYZ" and len(p.tool_calls()[1]["id"]) == 9


def test_hermes_call_cut_mid_tag_streams_what_it_read():
    content, calls, _ = _run("hermes", ['<tool_call>{"name": "get_weather", "arguments": {"city": "Pa'])
    assert (content, calls) == ("", [("get_weather", '{"city": "Pa')])


def test_parser_follows_the_template():
    assert parser_for_template("... [TOOL_CALLS] ...") == "mistral"
    assert parser_for_template('{"name": function name, "parameters": ...}') == "llama3_json"
    assert parser_for_template("<tool_call>") == "hermes"
    with pytest.raises(ValueError, match="known: hermes, llama3_json, mistral, phi4_mini_json, pythonic"):
        tool_call_parser("granite")


REASONING = [
    ("qwen3", "<think>\nUser wants a colour.\n</think>\n\nBlue.", "\nUser wants a colour.\n", "\n\nBlue."),
    ("qwen3", "Blue, no thinking.", "", "Blue, no thinking."),
    ("qwen3", "<think>cut short by max_tok", "cut short by max_tok", ""),
    ("qwen3", "<thi", "", "<thi"),  # fails mid-tag: text
    ("qwen3", "a < b </think", "", "a < b </think"),
    ("deepseek_r1", "Hmm, 2+2.</think>4", "Hmm, 2+2.", "4"),
    ("deepseek_r1", "<think>Hmm.</think>4", "Hmm.", "4"),
    ("deepseek_r1", "still thinking </thi", "still thinking </thi", ""),
]


@pytest.mark.parametrize("style,text,reasoning,content", REASONING)
def test_reasoning_golden(style, text, reasoning, content):
    for pieces in _splits(text):
        p = ReasoningParser(style)
        events = [e for piece in pieces for e in p.feed(piece)] + p.finish()
        assert "".join(e.text for e in events if isinstance(e, Reasoning)) == reasoning, pieces
        assert "".join(e.text for e in events if isinstance(e, Content)) == content, pieces
        assert (p.reasoning, p.content) == (reasoning, content)
