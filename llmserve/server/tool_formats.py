"""Tool-call notations besides Hermes' (``tool_parser.py``), read back whole or streamed, and
the registry ``--tool-call-parser`` names them from (vLLM's names):

- ``hermes``: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` (Qwen2.5, Qwen3);
- ``llama3_json``: the output is ``{"name": ..., "parameters": ...}`` (optionally after
  ``<|python_tag|>``), several joined by ``;`` (Llama 3.1+);
- ``mistral``: ``[TOOL_CALLS]`` then a JSON list of calls, or, from the v11 tokenizers,
  ``[TOOL_CALLS]name[ARGS]{...}`` per call;
- ``phi4_mini_json``: ``functools[{"name": ..., "arguments": ...}, ...]`` (Phi-4-mini);
- ``pythonic``: ``[get_weather(city="Paris"), get_time()]`` (Llama 3.2 / 4 and Gemma 3
  pythonic templates), in ``tool_formats_py.py``.

These parsers send a call once its JSON is complete (name and arguments in one go);
Hermes streams arguments as they come. Text before the first call is content; an output
whose call never completes (cut short, or not JSON) comes back as the content it was.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from typing import Any, Callable

from llmserve.server.tool_parser import CallArguments, CallStart, Content, Event, ToolCallParser, _held_back, \
    new_call_id

TOOL_CALL_PARSERS = ("hermes", "llama3_json", "mistral", "phi4_mini_json", "pythonic")
_DECODER = json.JSONDecoder()
_ALNUM = string.ascii_letters + string.digits
# How the pythonic templates ask for calls: Llama 3.2's "[func_name1(params_name1=...", Llama
# 4's "[func_name1(param1=value1, ...", Gemma 3's (vLLM's examples).
_PYTHONIC_TEMPLATE = re.compile(r"\[\s*func_name1\(|\bfunc_name1\(param(?:s_name)?1=")


class _BlockParser:
    """Content until ``tag`` (or, with ``at_start``, a call only at the very start), then calls."""

    tag = ""
    at_start = False

    def __init__(self, parallel: bool = True, new_id: Callable[[], str] = new_call_id) -> None:
        self.parallel, self.new_id = parallel, new_id
        self.content = ""
        self._calls: list[dict[str, Any]] = []
        self._buf = ""
        self._raw = ""  # the call region as written, given back as content if no call completes
        self._state = "before"  # before -> content | calls

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        events: list[Event] = []
        if self._state == "calls":
            self._raw += text
        if self._state == "before":
            self._start(events)
        if self._state == "content":
            self._text(self._buf, events)
            self._buf = ""
        elif self._state == "calls":
            self._read_calls(events)
        return events

    def finish(self) -> list[Event]:
        events = self.feed("")
        if self._state == "before" and self._buf:
            self._text(self._buf, events)
        elif self._state == "calls" and not self._calls and self._raw:
            self._text(self._raw, events)  # no call completed: it was text
        self._buf = ""
        return events

    def tool_calls(self) -> list[dict[str, Any]]:
        return self._calls if self.parallel else self._calls[:1]

    # -- internals
    def _start(self, events: list[Event]) -> None:
        if self.at_start:
            head = self._buf.lstrip()
            for opener in self.openers():
                if head.startswith(opener):  # the tag goes; a call's own "{" stays
                    self._buf = head[len(opener):] if opener == self.tag else head
                    self._raw, self._state = head, "calls"
                    return
                if opener.startswith(head):
                    return  # could still open a call
            self._state = "content"
            return
        i = self._buf.find(self.tag)
        if i < 0:
            ready, self._buf = _held_back(self._buf, self.tag)
            self._text(ready, events)
            return
        self._text(self._buf[:i], events)
        self._buf = self._buf[i + len(self.tag):]
        self._raw, self._state = self.tag + self._buf, "calls"

    def openers(self) -> tuple[str, ...]:
        return (self.tag,)

    def _read_calls(self, events: list[Event]) -> None:
        raise NotImplementedError

    def _text(self, text: str, events: list[Event]) -> None:
        if text:
            self.content += text
            events.append(Content(text))

    def _call(self, name: Any, args: Any, events: list[Event]) -> None:
        if not isinstance(name, str):
            return
        arguments = args if isinstance(args, str) else json.dumps(args if args is not None else {}, ensure_ascii=False)
        call = {"id": self.new_id(), "type": "function", "function": {"name": name, "arguments": arguments}}
        self._calls.append(call)
        if self.parallel or len(self._calls) == 1:
            events += [CallStart(len(self._calls) - 1, call["id"], name), CallArguments(len(self._calls) - 1, arguments)]

    def _value(self, skip: str) -> Any:
        """The next complete JSON value of the buffer after ``skip`` characters, consumed; or
        ``...`` when it is not complete yet."""
        s = self._buf.lstrip(skip)
        if not s:
            return ...
        try:
            value, end = _DECODER.raw_decode(s)
        except json.JSONDecodeError:
            return ...
        self._buf = s[end:]
        return value


class Llama3JsonParser(_BlockParser):
    tag = "<|python_tag|>"
    at_start = True

    def openers(self) -> tuple[str, ...]:
        return (self.tag, "{")

    def _read_calls(self, events: list[Event]) -> None:
        while (v := self._value(" \t\n;")) is not ...:
            if isinstance(v, dict):
                self._call(v.get("name"), v.get("parameters", v.get("arguments")), events)


class MistralParser(_BlockParser):
    tag = "[TOOL_CALLS]"
    _args = "[ARGS]"

    def _read_calls(self, events: list[Event]) -> None:
        while True:
            s = self._buf.lstrip()
            if s.startswith(self.tag):
                self._buf = s = s[len(self.tag):].lstrip()
            if s.startswith("["):  # a list of {"name", "arguments"}
                v = self._value(" \t\n")
                if v is ...:
                    return
                for call in v if isinstance(v, list) else []:
                    if isinstance(call, dict):
                        self._call(call.get("name"), call.get("arguments"), events)
                continue
            i = s.find(self._args)  # v11: name[ARGS]{...}
            if i < 0:
                return
            name, self._buf = s[:i].strip(), s[i + len(self._args):]
            v = self._value(" \t\n")
            if v is ...:
                self._buf = f"{name}{self._args}{self._buf}"
                return
            self._call(name, v, events)


class Phi4MiniJsonParser(_BlockParser):
    """``functools[...]``, a JSON list of ``{"name", "arguments"}`` (or ``"parameters"``);
    ``functools`` not followed by a list of calls (``functools.partial``) is text."""

    tag = "functools"

    def _read_calls(self, events: list[Event]) -> None:
        while self._state == "calls":
            s = self._buf.lstrip()
            if self._calls and s.startswith(self.tag):
                self._buf = s = s[len(self.tag):].lstrip()
            if not s:
                return
            if not s.startswith("["):
                if not self._calls:
                    self._prose(self.tag, events)
                return
            before, n = self._buf, len(self._calls)
            v = self._value(" \t\n")
            if v is ...:
                return
            for call in v if isinstance(v, list) else []:
                if isinstance(call, dict):
                    self._call(call.get("name"), call.get("arguments", call.get("parameters")), events)
            if not self._calls:  # a list, but no call in it: text
                self._prose(self.tag + before[:len(before) - len(self._buf)], events)
            elif len(self._calls) == n:
                return

    def _prose(self, text: str, events: list[Event]) -> None:
        """``text`` was not a call: back to reading content for the next ``functools``."""
        self._text(text, events)
        self._state = "before"
        self._start(events)


def mistral_call_id() -> str:
    """Nine letters and digits: Mistral's chat templates refuse any other tool call id when the
    call comes back in the next turn (vLLM's ``MistralToolCall`` ids)."""
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


def tool_call_parser(name: str, parallel: bool = True) -> Any:
    """The parser ``name`` (one of ``TOOL_CALL_PARSERS``) for one choice."""
    if name == "hermes":
        return ToolCallParser(parallel)
    if name == "llama3_json":
        return Llama3JsonParser(parallel)
    if name == "mistral":
        return MistralParser(parallel, new_id=mistral_call_id)
    if name == "phi4_mini_json":
        return Phi4MiniJsonParser(parallel)
    if name == "pythonic":
        from llmserve.server.tool_formats_py import PythonicParser  # it builds on _BlockParser

        return PythonicParser(parallel)
    raise ValueError(f"unknown tool call parser {name!r} (known: {', '.join(TOOL_CALL_PARSERS)})")


def parser_for_template(template_text: str) -> str:
    """The notation a chat template writes calls in (its literal text), Hermes when unsure.
    Phi-4-mini's ``functools[`` and the pythonic templates' ``[func_name1(`` come before
    ``"parameters"`` (their tool lists may be written that way too).
    ``<tool_call>`` wins over ``"parameters"``: Hermes-2-Pro/3 templates write both (the tool
    list as ``{"name": ..., "parameters": ...}``, calls in ``<tool_call>`` tags)."""
    if "[TOOL_CALLS]" in template_text:
        return "mistral"
    if "<tool_call>" in template_text:
        return "hermes"
    if "functools[" in template_text:
        return "phi4_mini_json"
    if _PYTHONIC_TEMPLATE.search(template_text):
        return "pythonic"
    if "<|python_tag|>" in template_text or '"parameters"' in template_text:
        return "llama3_json"
    return "hermes"
