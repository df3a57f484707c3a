"""The shape every tool-call notation but Hermes' is read in (``tool_formats.py``,
``tool_formats_py.py``): content until the notation's opener, then calls, each sent once
complete; an output whose call never completes comes back as the content it was."""

from __future__ import annotations

import json
from typing import Any, Callable

from llmserve.server.tool_parser import CallArguments, CallStart, Content, Event, _held_back, new_call_id

_DECODER = json.JSONDecoder()


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

    def _call(self, name: Any, args: Any, events: list[Event], call_id: str | None = None) -> None:
        """``call_id``: the id the model wrote (Mistral's ``[CALL_ID]``), else a new one."""
        if not isinstance(name, str):
            return
        arguments = args if isinstance(args, str) else json.dumps(args if args is not None else {}, ensure_ascii=False)
        call = {"id": call_id or self.new_id(), "type": "function", "function": {"name": name, "arguments": arguments}}
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
