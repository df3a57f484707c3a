"""The ``pythonic`` and ``phi4_mini_json`` tool-call notations (vLLM's names): golden outputs,
whole and streamed at every split point (the events joined give the whole parse), parses
that fail mid-way coming back as content, and the template choosing each."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

from llmserve.engine.outputs import CompletionOutput, RequestOutput
from llmserve.models.chat_template import ChatTemplate
from llmserve.server.config import ServerConfig
from llmserve.server.responses import ChoiceWriter, ResponseMeta
from llmserve.server.tool_formats import TOOL_CALL_PARSERS, parser_for_template, tool_call_parser
from llmserve.server.tool_parser import Content
from tests.server.test_tool_formats import _run as _events

PARIS = '{"city": "Paris"}'
ROME = '{"city": "Rome"}'
TEMPLATES = Path(__file__).parent.parent / "fixtures" / "chat_templates"


def _run(name: str, pieces: list[str], parallel: bool = True):
    """(content, calls as streamed, calls whole), each call as (name, arguments)."""
    content, streamed, calls = _events(name, pieces, parallel)
    return content, streamed, [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


def _splits(text: str):
    """Whole, cut in two at every point, a character at a time, and in pieces of 3."""
    yield [text]
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]
    yield list(text)
    yield [text[i:i + 3] for i in range(0, len(text), 3)]


GOLDEN = [
    # pythonic: Llama 3.2 / 4, Gemma 3
    ("pythonic", '[get_weather(city="Paris", unit="c"), get_time()]', "",
     [("get_weather", '{"city": "Paris", "unit": "c"}'), ("get_time", "{}")]),
    ("pythonic", "\n [get_weather(city='Paris'),\n  get_weather(city='Rome')]", "", [("get_weather", PARIS), ("get_weather", ROME)]),
    ("pythonic", "```tool_code\n[get_weather(city=\"Paris\")]\n```", "", [("get_weather", PARIS)]),
    ("pythonic", "```python\n[get_weather(city='Paris')]\n```\n", "", [("get_weather", PARIS)]),
    ("pythonic", '[book(when={"day": 3, "tags": ["a", "b"]}, ok=True, note=None, n=-1.5, q="it\'s \\"x\\" ]),(")]', "",
     [("book", '{"when": {"day": 3, "tags": ["a", "b"]}, "ok": true, "note": null, "n": -1.5, "q": "it\'s \\"x\\" ]),("}')]),
    ("pythonic", '[note(text="""a ") b""", t=(1, 2))]', "", [("note", '{"text": "a \\") b", "t": [1, 2]}')]),
    ("pythonic", "[set_flag(on=true, value=null)]", "", [("set_flag", '{"on": true, "value": null}')]),
    ("pythonic", "[get_weather(city='Zürich')]", "", [("get_weather", '{"city": "Zürich"}')]),
    ("pythonic", "[get_weather(city='Paris'),]", "", [("get_weather", PARIS)]),
    # a call completed, then cut short (max_tokens): the complete one stands
    ("pythonic", "[get_weather(city='Paris'), get_weather(city=", "", [("get_weather", PARIS)]),
    # calls sent stand; what follows them that is not a call, or follows the list, is dropped
    ("pythonic", "[get_weather(city='Paris'), 42, get_time()]", "", [("get_weather", PARIS)]),
    ("pythonic", "[get_weather(city='Paris')] Done.", "", [("get_weather", PARIS)]),
    # not calls: content, as written
    ("pythonic", "The weather in Paris is sunny.", "The weather in Paris is sunny.", []),
    ("pythonic", "Let me check: [get_weather(city='Paris')]", "Let me check: [get_weather(city='Paris')]", []),
    ("pythonic", "[get_weather(city=", "[get_weather(city=", []),  # cut short by max_tokens
    ("pythonic", "[not python", "[not python", []),
    ("pythonic", "[1] Smith et al. say so.", "[1] Smith et al. say so.", []),
    ("pythonic", "  [1, 2, 3]", "  [1, 2, 3]", []),
    ("pythonic", "[]", "[]", []),
    ("pythonic", "[get_weather('Paris')]", "[get_weather('Paris')]", []),  # positional: not sent
    ("pythonic", "[get_weather(city=paris)]", "[get_weather(city=paris)]", []),  # a variable
    ("pythonic", "[os.system(cmd='ls')]", "[os.system(cmd='ls')]", []),
    ("pythonic", "[f(x=__import__('os').getcwd())]", "[f(x=__import__('os').getcwd())]", []),
    ("pythonic", "```json\n[1]\n```", "```json\n[1]\n```", []),
    ("pythonic", "```", "```", []),
    # phi4_mini_json: Phi-4-mini
    ("phi4_mini_json", f'functools[{{"name": "get_weather", "arguments": {PARIS}}}, '
                       f'{{"name": "get_weather", "arguments": {ROME}}}]', "", [("get_weather", PARIS), ("get_weather", ROME)]),
    ("phi4_mini_json", f'Let me look.functools[{{"name": "get_weather", "parameters": {PARIS}}}]',
     "Let me look.", [("get_weather", PARIS)]),
    ("phi4_mini_json", f'functools [ {{"arguments": {PARIS}, "name": "get_weather"}} ]', "", [("get_weather", PARIS)]),
    ("phi4_mini_json", "Use functools.partial for that.", "Use functools.partial for that.", []),
    ("phi4_mini_json", "functools[] then functools[1]", "functools[] then functools[1]", []),
    ("phi4_mini_json", 'functools[{"name": "get_weather", "argu', 'functools[{"name": "get_weather", "argu', []),
    ("phi4_mini_json", "No call, functo", "No call, functo", []),
]


@pytest.mark.parametrize("name,text,content,calls", GOLDEN)
def test_golden_whole_and_streamed_at_every_split(name, text, content, calls):
    assert _run(name, [text]) == (content, calls, calls)
    for pieces in _splits(text):
        assert _run(name, pieces) == (content, calls, calls), pieces


@pytest.mark.parametrize("name,text", [
    ("pythonic", "[get_weather(city='Paris'), get_weather(city='Rome')]"),
    ("phi4_mini_json", f'functools[{{"name": "get_weather", "arguments": {PARIS}}}, {{"name": "get_weather", "arguments": {ROME}}}]'),
])
def test_parallel_false_keeps_the_first_call(name, text):
    for pieces in _splits(text):
        assert _run(name, pieces, parallel=False) == ("", [("get_weather", PARIS)], [("get_weather", PARIS)])


def test_plain_text_streams_as_content_as_it_comes():
    """A pythonic reply that is text is sent as it comes, not held to the end."""
    p = tool_call_parser("pythonic")
    assert p.feed("The ") == [Content("The ")]
    p = tool_call_parser("pythonic")
    assert p.feed("[1] Smith") == [Content("[1] Smith")]
    assert p.feed(" et al.") == [Content(" et al.")]
    p = tool_call_parser("phi4_mini_json")
    assert [e.text for e in p.feed("Try functools.partial") + p.feed(" here")] == ["Try ", "functools", ".partial", " here"]


def test_a_call_is_sent_once_its_parenthesis_closes():
    p = tool_call_parser("pythonic")
    assert p.feed("[get_weather(city='Paris'") == []
    (start, args) = p.feed("), ")
    assert (start.name, args.text) == ("get_weather", PARIS)
    assert p.feed("get_time()]")[0].name == "get_time"


# -- the template chooses the notation (snippets of the templates' own text)
LLAMA32_PYTHONIC = (
    "{%- if tools is not none and not tools_in_user_message %}"
    "{{- \"You have access to the following functions. To call functions, please respond with a python list of the calls. \" }}"
    "{{- 'Respond in the format [func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)] ' }}"
    "{{- \"Do not use variables.\\n\\n\" }}{%- for t in tools %}{{- t | tojson(indent=4) }}{%- endfor %}{%- endif %}"
    "{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
)
LLAMA4_PYTHONIC = (
    "{%- set system_message = \"- Use exact format: [func_name1(param1=value1, param2=value2), func_name2(...)]\\n"
    "Examples:\\nCORRECT: [get_weather(location=\\\"Vancouver\\\")]\" %}"
    "{{- \"<|header_start|>system<|header_end|>\\n\\n\" }}{{- system_message }}"
)
GEMMA3_PYTHONIC = (
    "{%- if tools is not none -%}"
    "{{- \"Tools (functions) are available. If you decide to invoke one or more of the tools, you must respond with a "
    "python list of the function calls.\\n\" -}}"
    "{{- \"Example Format: [func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)] \\n\" -}}"
    "{{- tools | tojson(indent=4) -}}{%- endif -%}"
    "{%- if (message['role'] == 'tool') -%}{{ '<tool_response>\\n' -}}{%- endif -%}"
)
PHI4_MINI = (
    "<|system|>\n{{ system_message }}\n{%- if tools %}\nIf you decide to call functions:\n"
    "  * prefix function calls with functools marker (no closing marker required)\n"
    "  * all function calls should be generated in a single JSON list formatted as functools[{\"name\": "
    "[function name], \"arguments\": [function arguments as JSON]}, ...]\n"
    "{%- for t in tools %}{{- t | tojson(indent=4) }}{%- endfor %}{%- endif %}<|end|>"
)


@pytest.mark.parametrize("template,parser", [(LLAMA32_PYTHONIC, "pythonic"), (LLAMA4_PYTHONIC, "pythonic"),
                                             (GEMMA3_PYTHONIC, "pythonic"), (PHI4_MINI, "phi4_mini_json")])
def test_parser_follows_the_template(template, parser):
    assert parser_for_template(ChatTemplate(template).literal_text()) == parser


@pytest.mark.parametrize("fixture,parser", [("meta-llama-Llama-3.2-3B-Instruct", "llama3_json"),
                                            ("mistralai-Mistral-Nemo-Instruct-2407", "mistral"),
                                            ("Qwen-Qwen2.5-7B-Instruct", "hermes"),
                                            ("microsoft-Phi-3.5-mini-instruct", "hermes"),
                                            ("google-gemma-2-2b-it", "hermes")])
def test_the_families_own_templates_keep_their_parsers(fixture, parser):
    text = ChatTemplate((TEMPLATES / f"{fixture}.jinja").read_text()).literal_text()
    assert parser_for_template(text) == parser


def test_the_flag_offers_every_parser():
    annotation = ServerConfig.model_fields["tool_call_parser"].annotation
    (literal,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    assert set(typing.get_args(literal)) == set(TOOL_CALL_PARSERS) >= {"pythonic", "phi4_mini_json"}
    assert ServerConfig(tool_call_parser="pythonic").tool_call_parser == "pythonic"
    # vLLM's llama4_pythonic names the same notation: a command copied from vLLM works
    assert _run("llama4_pythonic", ['[get_weather(city="Paris")]'])[2] == [("get_weather", PARIS)]
    with pytest.raises(ValueError, match="known: hermes, llama3_json, mistral, phi4_mini_json, pythonic"):
        tool_call_parser("granite")


def _out(text: str, delta: str, finished: bool) -> RequestOutput:
    c = CompletionOutput(0, text if finished else "", [], "stop" if finished else None, delta_text=delta)
    return RequestOutput("r", [], [c], finished)


@pytest.mark.parametrize("name,text", [
    ("pythonic", "```tool_code\n[get_weather(city='Paris'), get_weather(city='Rome')]\n```"),
    ("phi4_mini_json", f'functools[{{"name": "get_weather", "arguments": {PARIS}}}, {{"name": "get_weather", "arguments": {ROME}}}]'),
])
def test_a_chat_response_whole_and_streamed(name, text):
    meta = ResponseMeta("id", 0, "tiny", True, 1, False, tool_calls=True, tool_parser=name)
    msg = ChoiceWriter(0, meta, None).final(_out(text, text, True))
    assert msg["message"]["content"] is None and msg["finish_reason"] == "tool_calls"
    want = [{"name": "get_weather", "arguments": PARIS}, {"name": "get_weather", "arguments": ROME}]
    assert [c["function"] for c in msg["message"]["tool_calls"]] == want
    w = ChoiceWriter(0, meta, None)
    pieces = [text[i:i + 4] for i in range(0, len(text), 4)]
    choices = [ch for i, p in enumerate(pieces) for ch in w.chunks(_out(text, p, i == len(pieces) - 1))]
    calls: dict[int, dict] = {}
    for d in (ch["delta"] for ch in choices):
        assert not d.get("content")
        for tc in d.get("tool_calls", []):
            f = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
            f["name"] += tc["function"].get("name") or ""
            f["arguments"] += tc["function"].get("arguments") or ""
    assert [calls[i] for i in sorted(calls)] == want
    assert [json.loads(f["arguments"]) for f in want] == [{"city": "Paris"}, {"city": "Rome"}]
    assert choices[-1]["finish_reason"] == "tool_calls"
