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
    """Prompt lookup: the longest recent suffix that occurred earlier; propose what followed it."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n

    def propose(self, requests, k, rows):
        out = {}
        for r in requests:
            toks = find_ngram_continuation(r.all_token_ids, self.min_n, self.max_n, k)
            if toks:
                out[r.request_id] = Proposal(toks)
        return out

    def release(self, request_id: str) -> None:
        pass


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
