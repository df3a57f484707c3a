"""Continuing a stream another engine began: its output so far as this request's own.

A resumed request (``resume_token_ids``, sent by the gateway when an instance
died mid-stream) starts with those tokens as output already generated: they count
in ``max_tokens``, penalties, stop-string search, the grammar and usage, and
prefill computes them with the prompt (prefix caching makes that cheap when they
were seen here before). Its text goes on exactly where the first stream's stopped
because the text handed out after k tokens is a function of the k tokens alone:
the detokeniser is fed them one at a time, as decoding fed them (one token per
step), and the part held back for stop strings is the same ``hold_back`` chars.
Seeded draws depend only on (seed, position) (``position_seed``), so a resumed
seeded stream samples what the unbroken one would have.
"""

from __future__ import annotations

from typing import Any

from llmserve.engine.outputs import TokenLogprob
from llmserve.engine.sampling_params import InvalidParameterError

_MASK = 2**64 - 1


def check_resume(ids: list[int] | None, vocab: int, max_tokens: int) -> list[int]:
    """The given output tokens, checked: in the vocabulary, and leaving one to generate."""
    if not ids:
        return []
    ids = [int(t) for t in ids]
    if any(t < 0 or t >= vocab for t in ids):
        raise InvalidParameterError("resume_token_ids", f"has token ids outside the vocabulary [0, {vocab})")
    if len(ids) >= max_tokens:
        raise InvalidParameterError("resume_token_ids",
                                    f"has {len(ids)} tokens: max_tokens ({max_tokens}) leaves none to generate")
    return ids


def prime(state: Any, output_ids: list[int]) -> None:
    """Put a request's text state (output_processor.RequestState) where it was after
    ``output_ids``: their text made and, but for what stop strings hold back, handed out."""
    if not output_ids:
        return
    if state.detok is not None:
        min_tokens = state.request.sampling_params.min_tokens
        for i, t in enumerate(output_ids):  # one per step, as decoding fed them
            state.text += state.detok.add([t])
            if i < min_tokens:  # where the text stop strings skip ends (output_processor.py)
                state.stop_from = len(state.text)
        state.emitted = max(0, len(state.text) - state.hold_back)
    state.num_tokens_emitted = len(output_ids)
    if state.logprobs is not None:  # not known here; only later tokens' are reported
        state.logprobs.extend(TokenLogprob(t, float("nan")) for t in output_ids)


def _mix(x: int) -> int:
    """splitmix64's finaliser: neighbouring inputs give unrelated outputs."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
    return x ^ (x >> 31)


def position_seed(seed: int, position: int) -> int:
    """The generator seed of a seeded request's draw at output ``position``."""
    return _mix(_mix(seed & _MASK) ^ (position + 1)) >> 1  # (>> 1: below 2**63, any torch takes it)
