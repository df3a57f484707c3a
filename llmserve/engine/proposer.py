"""Speculative proposers: what guesses the next tokens of decoding requests.

A proposer sees only the requests it is asked about and a row function that pairs
a request (plus the guesses so far) with its sampling state; it never sees the
engine, the scheduler or the verifier (``spec_decode.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from llmserve.engine.request import Request
from llmserve.engine.sampler import RowFn


@dataclass(slots=True)
class Proposal:
    tokens: list[int]
    # Draft distributions the tokens were drawn from, one row per token; None means
    # the proposer is deterministic (n-gram): treated as one-hot.
    q: torch.Tensor | None = None


class Proposer(Protocol):
    """Guesses the next tokens of decoding requests.

    ``propose`` may return fewer than ``k`` tokens, or nothing, per request; it must
    not change the requests. ``release`` drops any state kept for a request.
    """

    def propose(self, requests: list[Request], k: int, rows: RowFn) -> dict[str, Proposal]: ...

    def release(self, request_id: str) -> None: ...


class NgramProposer:
    """Prompt lookup: the longest recent suffix that occurred earlier; propose what followed it.

    Each request keeps an index from every n-gram (``min_n`` to ``max_n`` tokens) to its
    latest start, brought up to date with the tokens added since the last call: a step
    costs a few dictionary look-ups per request, not a scan of its whole context (which
    took ~0.2 ms per request per step at a few hundred tokens).
    """

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self._index: dict[str, _NgramIndex] = {}

    def propose(self, requests, k, rows):
        out = {}
        for r in requests:
            index = self._index.get(r.request_id)
            if index is None:
                index = self._index[r.request_id] = _NgramIndex(self.min_n, self.max_n)
            toks = index.continuation(r.all_token_ids, k)
            if toks:
                out[r.request_id] = Proposal(toks)
        return out

    def release(self, request_id: str) -> None:
        self._index.pop(request_id, None)


class _NgramIndex:
    """n-gram -> latest start among those followed by a token, for one token sequence."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.starts: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # n-grams ending before this position are in ``starts``

    def continuation(self, tokens: list[int], k: int) -> list[int]:
        """What ``find_ngram_continuation(tokens, min_n, max_n, k)`` gives."""
        n_tok = len(tokens)
        if n_tok < self.indexed:  # not the sequence indexed so far
            self.starts.clear()
            self.indexed = 0
        starts = self.starts
        for end in range(max(self.indexed, 1), n_tok):  # grams ending at ``end`` (exclusive) have a follower
            for n in range(self.min_n, min(self.max_n, end) + 1):
                starts[tuple(tokens[end - n:end])] = end - n
        self.indexed = max(self.indexed, n_tok)
        for n in range(min(self.max_n, n_tok - 1), self.min_n - 1, -1):
            start = starts.get(tuple(tokens[n_tok - n:]))
            if start is not None:
                return tokens[start + n:start + n + k]
        return []


def find_ngram_continuation(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Tokens that followed the most recent earlier occurrence of the longest matching suffix."""
    n_tok = len(tokens)
    for n in range(min(max_n, n_tok - 1), min_n - 1, -1):
        suffix = tokens[n_tok - n:]
        # search right to left for the latest earlier match
        for start in range(n_tok - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                follow = tokens[start + n:start + n + k]
                if follow:
                    return follow
    return []
