"""A grammar that starts after the reasoning: structured outputs on a reasoning model.

A reasoning model writes ``<think>…</think>`` before its answer; a JSON schema or a tool
call constrains the answer only (vLLM's reasoning-aware structured outputs). This
matcher wraps a request's grammar matcher: while the model reasons every token is
allowed and the grammar does not advance; the token ``</think>`` ends the reasoning, and
from the next token on the grammar masks and advances as without reasoning.

Where the reasoning starts, by the server's ``--reasoning-parser`` style:

- ``deepseek_r1``: the output is reasoning until ``</think>`` (the template opened it);
- ``qwen3``: reasoning only when the output opens with ``<think>``: the first token may be
  ``<think>`` or one the grammar allows;
- either way the prompt decides first: one whose last tag is ``</think>`` (Qwen3 with
  ``enable_thinking`` false puts the empty pair there) starts in the answer, one whose
  last tag is ``<think>`` starts in the reasoning.

A vocabulary where the tags are not single tokens has no reasoning to skip: the grammar
then holds from the first token, as without a reasoning parser.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # pure Python at run time: the API process reads the prompt's phase too
    import torch

    from llmserve.engine.grammar import Matcher

STYLES = ("qwen3", "deepseek_r1")
START, END = "<think>", "</think>"
# phases: the first token may still open the reasoning / reasoning / the answer (the grammar's)
OPENING, REASONING, ANSWER = "opening", "reasoning", "answer"


def think_tokens(tokenizer: Any) -> tuple[int, int] | None:
    """The token ids of ``<think>`` and ``</think>``, or None unless each is one token: a
    vocabulary without them is no reasoning model's, and its grammar holds from the start."""
    ids = []
    for tag in (START, END):
        enc = tokenizer.encode(tag, add_special_tokens=False) if tokenizer is not None else []
        if len(enc) != 1:
            return None
        ids.append(enc[0])
    return ids[0], ids[1]


def first_phase(style: str, start_id: int, end_id: int, prompt_ids: Sequence[int]) -> str:
    """Where the output begins: in the answer, the reasoning, or where it may open."""
    if style not in STYLES:
        raise ValueError(f"unknown reasoning style {style!r} (known: {STYLES})")
    for t in reversed(prompt_ids):
        if t == end_id:
            return ANSWER
        if t == start_id:
            return REASONING
    return REASONING if style == "deepseek_r1" else OPENING


def _allow(bitmask: "torch.Tensor", index: int, token_id: int) -> None:
    word, bit = divmod(token_id, 32)
    value = int(bitmask[index, word]) & 0xFFFFFFFF | (1 << bit)
    bitmask[index, word] = value - (1 << 32) if value >= 1 << 31 else value  # int32 words


class AfterReasoning:
    """A :class:`~llmserve.engine.grammar.Matcher` whose grammar begins after ``</think>``."""

    def __init__(self, inner: "Matcher", phase: str, start_id: int, end_id: int) -> None:
        self.inner = inner
        self.phase = phase
        self.start_id, self.end_id = start_id, end_id
        # per accepted token: (phase before it, whether the grammar took it), for rollback
        self._history: list[tuple[str, bool]] = []

    def accept_token(self, token_id: int) -> bool:
        before = self.phase
        if before == ANSWER or (before == OPENING and token_id != self.start_id):
            if not self.inner.accept_token(token_id):
                return False
            self.phase = ANSWER
            self._history.append((before, True))
            return True
        if before == OPENING:
            self.phase = REASONING
        elif token_id == self.end_id:
            self.phase = ANSWER
        self._history.append((before, False))
        return True

    def fill_next_token_bitmask(self, bitmask: "torch.Tensor", index: int = 0) -> None:
        if self.phase == REASONING:
            bitmask[index].fill_(-1)
            return
        self.inner.fill_next_token_bitmask(bitmask, index)
        if self.phase == OPENING:
            _allow(bitmask, index, self.start_id)

    def rollback(self, num_tokens: int = 1) -> None:
        took = 0
        for _ in range(num_tokens):
            self.phase, by_grammar = self._history.pop()
            took += by_grammar
        if took:
            self.inner.rollback(took)

    def is_terminated(self) -> bool:
        return self.phase == ANSWER and self.inner.is_terminated()
