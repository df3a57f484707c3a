"""The ``pythonic`` tool-call notation (vLLM's name): the output is a Python list of calls,
``[get_weather(city="Paris", unit="c"), get_time()]`` (Llama 3.2 / Llama 4 and Gemma 3 with
pythonic templates), optionally in a ```` ```tool_code ```` or ```` ```python ```` fence (how
Gemma 3 is often prompted to answer).

As vLLM's parser does, the output is read as calls only when it opens with the list (after
whitespace, or the fence); otherwise it is all content. Each call is read with ``ast`` alone
(``ast.parse``, then ``ast.literal_eval`` on each keyword's value; nothing is evaluated) and
sent once its closing parenthesis is read, its arguments as a JSON object string. Text that
turns out not to be calls (``[1] Smith et al.``, ``[not python``, a list cut short before
its first call completes) comes back as the content it was; text after the list is dropped.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from llmserve.server.tool_block import _BlockParser
from llmserve.server.tool_parser import Event

_FENCES = ("```tool_code", "```python")
_JSON_NAMES = {"true": True, "false": False, "null": None}  # JSON literals a model writes in Python
_NAME_CHARS = re.compile(r"[\w\s]")


class _NotCalls(Exception):
    pass


class PythonicParser(_BlockParser):
    at_start = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = "open"  # open -> list -> elem | sep -> done
        self._pos = 0  # how far into the buffer the current call has been scanned
        self._depth = 0
        self._quote = ""  # the string the scan is inside: ', ", ''' or """

    def openers(self) -> tuple[str, ...]:
        return ("[",) + _FENCES

    def _start(self, events: list[Event]) -> None:
        text = self._buf
        super()._start(events)
        if self._state == "calls":
            self._raw = text  # leading whitespace too, should it turn out to be content

    def _read_calls(self, events: list[Event]) -> None:
        try:
            while self._phase != "done" and self._step(events):
                pass
        except _NotCalls:
            if self._calls:  # calls already sent stand; what follows them is dropped
                self._phase, self._buf = "done", ""
            else:  # it was text all along
                self._state, self._buf = "content", ""
                self._text(self._raw, events)
        if self._phase == "done":
            self._buf = ""

    def _step(self, events: list[Event]) -> bool:
        """One step of the list's reading; False when it needs more text."""
        if self._phase == "elem":
            return self._element(events)
        s = self._buf.lstrip()
        if not s:
            return False
        if self._phase == "open":  # an optional fence, then "["
            if s.startswith("```"):
                line, nl, rest = s.partition("\n")
                if not nl:
                    if not any(f.startswith(line.rstrip()) or line.startswith(f) for f in _FENCES):
                        raise _NotCalls
                    return False
                if line.strip() not in _FENCES:
                    raise _NotCalls
                self._buf = rest
                return True
            if s[0] != "[":
                raise _NotCalls
            self._buf, self._phase = s[1:], "list"
            return True
        if s[0] == "]":  # "[]", "[f(),]" or the end of the list
            self._buf, self._phase = s[1:], "done"
            return True
        if self._phase == "sep":
            if s[0] != ",":
                raise _NotCalls
            self._buf, self._phase = s[1:], "list"
            return True
        self._buf, self._phase, self._pos, self._depth = s, "elem", 0, 0  # "list": a call begins
        return True

    def _element(self, events: list[Event]) -> bool:
        """Scans the call at the buffer's start to its closing parenthesis (strings, escapes and
        nested brackets aware), then reads it."""
        s, i, n = self._buf, self._pos, len(self._buf)
        while i < n:
            ch = s[i]
            if self._quote:
                q = self._quote
                if ch == "\\":
                    if i + 1 >= n:
                        break
                    i += 2
                    continue
                if ch == q[0]:
                    if s.startswith(q, i):
                        i, self._quote = i + len(q), ""
                        continue
                    if n - i < len(q) and q.startswith(s[i:]):
                        break  # a closing triple quote, maybe
                i += 1
                continue
            if ch in "'\"":
                if n - i < 3 and s[i:] == ch * (n - i):
                    break  # a triple quote, maybe
                self._quote = ch * 3 if s.startswith(ch * 3, i) else ch
                i += len(self._quote)
                continue
            if ch in "([{":
                if self._depth == 0 and ch != "(":
                    raise _NotCalls
                self._depth += 1
            elif ch in ")]}":
                self._depth -= 1
                if self._depth < 0:
                    raise _NotCalls
                if self._depth == 0:
                    self._call(*_read_call(s[:i + 1]), events)
                    self._buf, self._phase = s[i + 1:], "sep"
                    return True
            elif self._depth == 0 and not _NAME_CHARS.match(ch):
                raise _NotCalls  # "[Note: ...", "[1, 2]"
            i += 1
        self._pos = i
        return False


def _read_call(text: str) -> tuple[str, str]:
    """The name and JSON arguments of one ``name(key=value, ...)``; values literals only."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        raise _NotCalls from e
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args \
            or any(k.arg is None for k in node.keywords):
        raise _NotCalls  # a method, positional arguments or **kwargs: not a call we can send
    try:
        args = {k.arg: ast.literal_eval(_JsonNames().visit(k.value)) for k in node.keywords}
        return node.func.id, json.dumps(args, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
        raise _NotCalls from e  # not a literal (a variable, an expression), or no JSON for it


class _JsonNames(ast.NodeTransformer):
    """``true`` / ``false`` / ``null`` as the constants they mean (models mix JSON in)."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in _JSON_NAMES:
            return ast.copy_location(ast.Constant(_JSON_NAMES[node.id]), node)
        return node
