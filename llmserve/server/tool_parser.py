"""Reading tool calls back from the output, whole or streamed (the notation is
``tool_calls.py``'s): events a stream turns into OpenAI's ``delta.tool_calls``."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from llmserve.server.tool_calls import CLOSE, OPEN


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
    _quoted: tuple[bool, bool] = (False, False)  # the block so far ends inside a JSON string, after a backslash

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        events: list[Event] = []
        while self._buf:
            if not self._in_call:
                i = self._buf.find(OPEN)
                if i < 0:
                    ready, self._buf = _held_back(self._buf, OPEN)
                    self._text(ready, events)
                    return events
                self._text(self._buf[:i], events)
                self._buf, self._in_call, self._block, self._quoted = self._buf[i + len(OPEN):], True, "", (False, False)
                if self.parallel or not self.calls:
                    self.calls.append(_Call(self.new_id()))
                else:
                    self.calls.append(_Call(""))  # past the first with parallel off: read, not sent
            j = self._close_at()
            if j < 0:
                ready, self._buf = _held_back(self._buf, CLOSE)
                self._grow(ready, events)
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

    def _close_at(self) -> int:
        """Where the call's closing tag starts in the buffer: not inside a JSON string, which
        may hold the tag's text (-1: not yet)."""
        j, done, quoted = self._buf.find(CLOSE), 0, self._quoted
        while j >= 0:
            quoted = _quote_state(self._buf[done:j], quoted)
            if not quoted[0]:
                return j
            done, j = j, self._buf.find(CLOSE, j + 1)
        return -1

    def _grow(self, text: str, events: list[Event]) -> None:
        call = self.calls[-1]
        self._block += text
        self._quoted = _quote_state(text, self._quoted)
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
            if not self.calls:  # no call after all: the text as written (cut short: no close)
                self._text(f"{OPEN}{self._block}{CLOSE if complete else ''}", events)
            return
        call.name = name
        call.arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        events += [CallStart(self._index(), call.id, name), CallArguments(self._index(), call.arguments)]

    def _index(self) -> int:
        return sum(1 for c in self.calls if c.id) - 1


def _quote_state(text: str, state: tuple[bool, bool]) -> tuple[bool, bool]:
    """(inside a JSON string, after a backslash there) at the end of ``text``, from ``state``."""
    in_string, escape = state
    if not in_string and '"' not in text:
        return state
    for ch in text:
        if escape:
            escape = False
        elif in_string and ch == "\\":
            escape = True
        elif ch == '"':
            in_string = not in_string
    return in_string, escape


def _held_back(text: str, tag: str) -> tuple[str, str]:
    """``text`` split before its longest end that could begin ``tag``: (ready, held back)."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return text[:-n], text[-n:]
    return text, ""


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
