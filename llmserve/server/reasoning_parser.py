"""Splitting a reasoning model's output into its reasoning and its answer, whole or streamed.

Qwen3 and the DeepSeek-R1 distills write their reasoning between ``<think>`` and
``</think>``; it comes back as ``reasoning_content`` and the rest as ``content`` (vLLM's
``--reasoning-parser`` and field names). Two styles, by vLLM's names:

- ``qwen3``: reasoning only when the output opens with ``<think>`` (Qwen3 with
  ``enable_thinking`` false writes none, and its template puts the empty pair in the prompt);
- ``deepseek_r1``: the template already opened ``<think>`` in the prompt, so the output
  is reasoning until ``</think>``; an opening tag the model writes anyway is dropped.

A tag split across stream pieces is held back until it is told apart from text.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmserve.server.tool_parser import Content, _held_back

START, END = "<think>", "</think>"
REASONING_PARSERS = ("qwen3", "deepseek_r1")


@dataclass(slots=True)
class Reasoning:
    text: str


class ReasoningParser:
    """Feed output text as it comes (``feed``), then ``finish``; each returns Reasoning and
    Content events, in order. ``reasoning`` and ``content`` hold the whole of each."""

    def __init__(self, style: str, prompt_phase: str | None = None) -> None:
        """``prompt_phase``: where the prompt left the output (``reasoning_gate.first_phase``,
        as the engine's grammar sees it): a prompt that closed ``</think>`` leaves none to
        split, one that opened ``<think>`` leaves reasoning first whatever the style."""
        if style not in REASONING_PARSERS:
            raise ValueError(f"unknown reasoning parser {style!r} (known: {', '.join(REASONING_PARSERS)})")
        self.style = "deepseek_r1" if prompt_phase == "reasoning" else style
        self.reasoning = ""
        self.content = ""
        self._buf = ""
        # before: the opening tag may still come; inside: reasoning; after: the answer
        self._state = "after" if prompt_phase == "answer" else "before"

    def feed(self, text: str) -> list[Reasoning | Content]:
        self._buf += text
        events: list[Reasoning | Content] = []
        if self._state == "before":
            head = self._buf.lstrip()
            if START.startswith(head) and len(head) < len(START):
                return events  # could still be the opening tag
            if head.startswith(START):
                self._buf, self._state = head[len(START):], "inside"
            else:
                self._state = "inside" if self.style == "deepseek_r1" else "after"
        if self._state == "inside":
            i = self._buf.find(END)
            if i < 0:
                ready, self._buf = _held_back(self._buf, END)
                self._emit(Reasoning(ready), events)
                return events
            self._emit(Reasoning(self._buf[:i]), events)
            self._buf, self._state = self._buf[i + len(END):], "after"
            if not self._buf:
                return events
        self._emit(Content(self._buf), events)
        self._buf = ""
        return events

    def finish(self) -> list[Reasoning | Content]:
        """What was held back: reasoning cut short, or text that only looked like a tag's start."""
        events: list[Reasoning | Content] = []
        if self._buf:
            if self._state == "inside" or (self._state == "before" and self.style == "deepseek_r1"):
                self._emit(Reasoning(self._buf), events)
            else:
                self._emit(Content(self._buf), events)
            self._buf = ""
        return events

    def _emit(self, e: Reasoning | Content, events: list[Reasoning | Content]) -> None:
        if not e.text:
            return
        if isinstance(e, Reasoning):
            self.reasoning += e.text
        else:
            self.content += e.text
        events.append(e)
