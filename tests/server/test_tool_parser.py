"""Reading tool calls back (tool_parser.py): whole, and streamed in any chunking."""

from __future__ import annotations

import random

import pytest

from llmserve.server.tool_parser import CallArguments, CallStart, Content, ToolCallParser

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


@pytest.mark.parametrize("seed", [None, 1, 2])
def test_an_opening_tag_never_closed_and_no_call_is_content_whole(seed):
    """A ``<tool_call>`` that no call follows (the tag written as text, or a call cut before its
    name) leaves the text as written, as a block that is not a call does: nothing dropped."""
    for text in ("I think <tool_call> is a tag", '<tool_call>\n{"na'):
        p, events = _parse_in_chunks(text, seed)
        assert p.tool_calls() == [] and p.content == text
        assert "".join(e.text for e in events if isinstance(e, Content)) == text


@pytest.mark.parametrize("seed", [None, *range(20)])
def test_a_closing_tag_inside_an_argument_string_does_not_end_the_call(seed):
    """The grammar lets a JSON string hold "</tool_call>" (an agent writing a prompt file):
    the call ends at the tag after the JSON, not mid-string with half its arguments."""
    args = '{"text": "write <tool_call> then </tool_call>, \\"</tool_call>\\"", "n": 1}'
    text = f'<tool_call>\n{{"name": "save", "arguments": {args}}}\n</tool_call>\n<tool_call>\n' \
           '{"arguments": {"q": "</tool_call>"}, "name": "g"}\n</tool_call>'
    p, events = _parse_in_chunks(text, seed)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in p.tool_calls()] == \
        [("save", args), ("g", '{"q": "</tool_call>"}')]
    assert "".join(e.text for e in events if isinstance(e, CallArguments) and e.index == 0) == args
