"""Tool calls in the Hermes / Qwen format: the prompt that offers tools, the grammar
that constrains calls, and the parser that reads them back, whole or streamed.

A model whose chat template renders ``tools`` itself gets them that way; for one
whose template does not (SmolLM2's), the tools' JSON schemas go into a system
message that asks for calls as

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

and past calls and tool results are written back in the same notation. Either
way, calls are read in this notation, and generation is constrained to it: with
``tool_choice`` "required" or a named function the output is one or more calls
whose arguments match the function's parameters; with "auto" the text is free
until the model opens ``<tool_call>``, and the call inside is constrained.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

OPEN, CLOSE = "<tool_call>", "</tool_call>"

TOOLS_SYSTEM = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


# ---- prompt ------------------------------------------------------------------------------

def render_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Messages for a template with no tool syntax: tools in the system message, calls and
    results as text (consecutive results in one user turn, as Qwen's template does)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = "\n".join(f"{OPEN}\n{json.dumps(_call_body(c), ensure_ascii=False)}\n{CLOSE}"
                              for c in m["tool_calls"])
            out.append({"role": "assistant", "content": (m["content"] + "\n" if m["content"] else "") + calls})
        elif m["role"] == "tool":
            text = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("_results"):
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text, "_results": True})
        else:
            out.append({k: v for k, v in m.items() if k not in ("tool_calls", "tool_call_id")})
    for m in out:
        m.pop("_results", None)
    if tools:
        block = TOOLS_SYSTEM.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def _call_body(call: dict[str, Any]) -> dict[str, Any]:
    fn = call["function"]
    return {"name": fn["name"], "arguments": fn["arguments"]}


# ---- grammar -----------------------------------------------------------------------------

def call_grammar(tools: list[dict[str, Any]], mode: str, parallel: bool) -> dict[str, Any] | None:
    """The xgrammar structural tag for ``mode`` ('auto', 'required', or 'named' with
    ``tools`` holding just that function); None for 'none'."""
    if mode == "none":
        return None
    tags = [{"type": "tag", "begin": OPEN + "\n", "end": "\n" + CLOSE, "content": {
        "type": "json_schema", "json_schema": {
            "type": "object", "additionalProperties": False, "required": ["name", "arguments"],
            "properties": {"name": {"const": t["function"]["name"]},
                           "arguments": t["function"].get("parameters") or {"type": "object", "properties": {}}}}}}
        for t in tools]
    if mode == "auto":
        fmt = {"type": "triggered_tags", "triggers": [OPEN], "tags": tags, "at_least_one": False,
               "stop_after_first": not parallel}
    else:
        fmt = {"type": "tags_with_separator", "tags": tags, "separator": "\n", "at_least_one": True,
               "stop_after_first": mode == "named" or not parallel}
    return {"type": "structural_tag", "format": fmt}


# ---- parser ------------------------------------------------------------------------------

@dataclass(slots=True)
class Content:
    text: str


@dataclass(slots=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(slots=True)
class CallArguments:
    index: int
    text: str


Event = Content | CallStart | CallArguments
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class _Call:
    id: str
    name: str | None = None
    arguments: str = ""
    scan: "_ValueEnd | None" = None  # where the streamed arguments end


@dataclass
class ToolCallParser:
    """Feed the output text as it comes (``feed``), then ``finish``; each returns events.

    Content is the text before the first call. A call's name is sent as soon as it is
    read, then its arguments piece by piece, exactly as the model wrote them (so the
    pieces join to the same string a non-streamed response has). Text after the first
    call outside a call is dropped; with ``parallel`` false, so are calls after the
    first. A block that is not a call (no JSON, no name) before any call is content.
    """

    parallel: bool = True
    new_id: Callable[[], str] = new_call_id
    calls: list[_Call] = field(default_factory=list)
    content: str = ""
    _buf: str = ""
    _in_call: bool = False
    _block: str = ""

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        events: list[Event] = []
        while self._buf:
            if not self._in_call:
                i = self._buf.find(OPEN)
                if i < 0:
                    keep = _partial_suffix(self._buf, OPEN)
                    self._text(self._buf[:len(self._buf) - keep], events)
                    self._buf = self._buf[len(self._buf) - keep:]
                    return events
                self._text(self._buf[:i], events)
                self._buf, self._in_call, self._block = self._buf[i + len(OPEN):], True, ""
                if self.parallel or not self.calls:
                    self.calls.append(_Call(self.new_id()))
                else:
                    self.calls.append(_Call(""))  # past the first with parallel off: read, not sent
            j = self._buf.find(CLOSE)
            if j < 0:
                keep = _partial_suffix(self._buf, CLOSE)
                self._grow(self._buf[:len(self._buf) - keep], events)
                self._buf = self._buf[len(self._buf) - keep:]
                return events
            self._grow(self._buf[:j], events)
            self._buf, self._in_call = self._buf[j + len(CLOSE):], False
            self._close(events)
        return events

    def finish(self) -> list[Event]:
        """The rest: held-back text, and a call cut short (by max_tokens) as far as it got."""
        events = self.feed("")
        if self._in_call:
            self._grow(self._buf, events)
            self._buf = ""
            self._close(events, complete=False)
        elif self._buf:
            self._text(self._buf, events)
            self._buf = ""
        return events

    def tool_calls(self) -> list[dict[str, Any]]:
        """The calls, shaped as OpenAI's ``message.tool_calls``."""
        return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.calls if c.id and c.name is not None]

    # -- internals
    def _text(self, text: str, events: list[Event]) -> None:
        if text and not self.calls:
            self.content += text
            events.append(Content(text))

    def _grow(self, text: str, events: list[Event]) -> None:
        call = self.calls[-1]
        self._block += text
        if not call.id:
            return
        if call.name is None:
            m = _HEAD.match(self._block)
            if m is None:
                return
            call.name = json.loads(f'"{m.group(1)}"')
            call.scan = _ValueEnd()
            events.append(CallStart(self._index(), call.id, call.name))
            text = self._block[m.end():]
        if call.scan is not None and not call.scan.done:
            if not call.scan.started:
                text = text.lstrip()  # however the text was chunked, arguments start at the value
            piece = text[:call.scan.feed(text)]
            if piece:
                call.arguments += piece
                events.append(CallArguments(self._index(), piece))

    def _close(self, events: list[Event], complete: bool = True) -> None:
        call = self.calls[-1]
        if not call.id or call.name is not None:
            return  # not sent, or already streamed
        try:  # keys in another order: the whole call at once
            body = json.loads(self._block)
            name, args = body["name"], body["arguments"]
            assert isinstance(name, str)
        except (ValueError, KeyError, TypeError, AssertionError):
            self.calls.pop()
            if complete and not self.calls:
                self._text(f"{OPEN}{self._block}{CLOSE}", events)
            return
        call.name = name
        call.arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        events += [CallStart(self._index(), call.id, name), CallArguments(self._index(), call.arguments)]

    def _index(self) -> int:
        return sum(1 for c in self.calls if c.id) - 1


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that could begin ``tag``."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class _ValueEnd:
    """Finds where one JSON value ends, fed a character at a time (strings and escapes aware)."""

    __slots__ = ("depth", "in_string", "escape", "started", "done")

    def __init__(self) -> None:
        self.depth, self.in_string, self.escape, self.started, self.done = 0, False, False, False, False

    def feed(self, text: str) -> int:
        """How much of ``text`` belongs to the value."""
        for i, ch in enumerate(text):
            if self.done:
                return i
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
                    self.done = self.depth == 0
            elif ch in "{[":
                self.depth += 1
                self.started = True
            elif ch in "}]":
                self.depth -= 1
                self.done = self.depth <= 0
            elif ch == '"':
                self.in_string = self.started = True
            elif ch in ",\n" and self.started and self.depth == 0:
                self.done = True  # a bare number or literal ended
                return i
            elif not ch.isspace():
                self.started = True
        return len(text)
