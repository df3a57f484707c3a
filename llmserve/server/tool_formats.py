"""Tool-call notations besides Hermes' (``tool_parser.py``), read back whole or streamed, and
the registry ``--tool-call-parser`` names them from (vLLM's names):

- ``hermes``: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` (Qwen2.5, Qwen3);
- ``llama3_json``: the output is ``{"name": ..., "parameters": ...}`` (optionally after
  ``<|python_tag|>``), several joined by ``;`` (Llama 3.1+);
- ``mistral``: ``[TOOL_CALLS]`` then a JSON list of calls (or one call object), or, from
  the v11 tokenizers, ``[TOOL_CALLS]name[ARGS]{...}`` per call (v13:
  ``name[CALL_ID]id[ARGS]{...}``, the model's id kept as the call's);
- ``phi4_mini_json``: ``functools[{"name": ..., "arguments": ...}, ...]`` (Phi-4-mini);
- ``pythonic``: ``[get_weather(city="Paris"), get_time()]`` (Llama 3.2 / 4 and Gemma 3
  pythonic templates), in ``tool_formats_py.py``.

These parsers send a call once its JSON is complete (name and arguments in one go);
Hermes streams arguments as they come. Text before the first call is content; an output
whose call never completes (cut short, or not JSON) comes back as the content it was.
"""

from __future__ import annotations

import re
import secrets
import string
from typing import Any, Callable

from llmserve.server.tool_block import _BlockParser
from llmserve.server.tool_formats_py import PythonicParser
from llmserve.server.tool_parser import Event, ToolCallParser, new_call_id

TOOL_CALL_PARSERS = ("hermes", "llama3_json", "mistral", "phi4_mini_json", "pythonic", "llama4_pythonic")
_ALNUM = string.ascii_letters + string.digits
# How the pythonic templates ask for calls: Llama 3.2's "[func_name1(params_name1=...", Llama
# 4's "[func_name1(param1=value1, ...", Gemma 3's (vLLM's examples).
_PYTHONIC_TEMPLATE = re.compile(r"\[\s*func_name1\(|\bfunc_name1\(param(?:s_name)?1=")


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
    _call_id = "[CALL_ID]"

    def _read_calls(self, events: list[Event]) -> None:
        while True:
            s = self._buf.lstrip()
            if s.startswith(self.tag):
                self._buf = s = s[len(self.tag):].lstrip()
            if s.startswith(("[", "{")):  # a list of {"name", "arguments"}, or one such object
                v = self._value(" \t\n")
                if v is ...:
                    return
                for call in v if isinstance(v, list) else [v]:
                    if isinstance(call, dict):
                        self._call(call.get("name"), call.get("arguments"), events)
                continue
            i = s.find(self._args)  # v11: name[ARGS]{...}; v13: name[CALL_ID]id[ARGS]{...}
            if i < 0:
                return
            head, self._buf = s[:i], s[i + len(self._args):]
            v = self._value(" \t\n")
            if v is ...:
                self._buf = f"{head}{self._args}{self._buf}"
                return
            name, _, call_id = head.partition(self._call_id)
            # the model's own id: the next turn's tool result refers to it
            self._call(name.strip(), v, events, call_id.strip() or None)


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


def call_ids(name: str) -> Callable[[], str]:
    """Call ids in the shape the notation ``name``'s templates take back in the next turn."""
    return mistral_call_id if name == "mistral" else new_call_id


def tool_call_parser(name: str, parallel: bool = True) -> Any:
    """The parser ``name`` (one of ``TOOL_CALL_PARSERS``) for one choice."""
    if name == "hermes":
        return ToolCallParser(parallel)
    if name == "llama3_json":
        return Llama3JsonParser(parallel)
    if name == "mistral":
        return MistralParser(parallel, new_id=call_ids(name))
    if name == "phi4_mini_json":
        return Phi4MiniJsonParser(parallel)
    if name in ("pythonic", "llama4_pythonic"):  # vLLM's two names for the one notation
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
