"""One admitted request's account: what it reserved, the stream's charges, the settlement.

Admission reserves the estimate (``decision.estimate``). A stream that goes past what
it reserved (its budget could not cover the whole estimate, or it outruns it) reserves
``stream_charge_tokens`` more at a time as it runs, the relay asking at ``next_at``.
``close`` settles once, when the request ends however it ends: the difference between
the actual usage and what was reserved is given back (or added), and the concurrency
hold is dropped.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Coroutine
from dataclasses import replace
from typing import Protocol

from llmserve.api.errors import error_body
from llmserve.gateway.tenants.config import KeyLimits, Prices
from llmserve.gateway.tenants.decision import Ask, Denied, Kind, Limit, budget_cost, token_asks
from llmserve.gateway.tenants.store import CounterStore

log = logging.getLogger(__name__)

_UNCAPPED = 1 << 62  # a stream's tokens go on counting past the window's cap; only the budget stops it
_NEVER = 1 << 62
# The relay counts each data event a token; a stream's closing chunks (the finish reason,
# usage when asked for) are two more that cost nothing: no charge for them alone, while
# the reservation covers the whole answer. A stream reserved batch by batch has none: an
# event past its reservation may be a token, and a refused charge could not take it back.
_CLOSING = 2


class Ledger(Protocol):
    """What a tab needs of the limiter (``limiter.Tenants``)."""

    async def reserve(self, key: str, asks: list[Ask]) -> tuple[Denied | None, CounterStore]: ...

    def counted(self, key: str, outcome: str) -> None: ...

    def used(self, key: str, model: str, prompt: int, completion: int) -> None: ...

    def background(self, work: Coroutine) -> None: ...

    def unreachable(self, error: BaseException) -> None: ...


class Tab:
    __slots__ = ("_budget", "_hold", "_store", "_tokens", "closed", "completion", "limits", "model", "name",
                 "next_at", "prices", "prompt", "rate_headers", "tenants")

    def __init__(self, tenants: Ledger, name: str, model: str, limits: KeyLimits, prices: Prices,
                 store: CounterStore | None, asks: list[Ask], prompt: int, completion: int, stream: bool,
                 whole: bool = True) -> None:
        self.tenants, self.name, self.model = tenants, name, model
        self.rate_headers: dict[str, str] = {}  # x-ratelimit-* of its admission, for the response
        self.limits, self.prices = limits, prices
        self.prompt, self.completion = prompt, completion  # tokens reserved so far
        # whole: the reservation covers the answer's max_tokens (else its first batch only)
        self.next_at = completion + (_CLOSING if whole else 0) if stream and self._charged(asks) else _NEVER
        self.closed = False
        self._store = store
        self._tokens = next((a for a in asks if a.limit is Limit.TOKENS), None)  # the latest of each
        self._budget = next((a for a in asks if a.limit is Limit.BUDGET), None)
        self._hold = next((a for a in asks if a.kind is Kind.HOLD), None)

    @staticmethod
    def _charged(asks: list[Ask]) -> bool:
        return any(a.limit in (Limit.TOKENS, Limit.BUDGET) for a in asks)

    @property
    def _reserved_cost(self) -> int:
        return budget_cost(self.limits, self.prices, self.prompt, self.completion)

    async def charge(self, produced: int) -> bytes | None:
        """A stream is about to have sent ``produced`` tokens, past ``next_at``: reserve
        those and the next batch. None: go on; else the stream's last events (an
        insufficient_quota error, then [DONE]): the budget has no room for them, and
        the stream sends only the ``room`` its reservation still covers."""
        more = self.limits.stream_charge_tokens + max(0, produced - self.completion)
        # the budget asks for the difference in cost (prices round up), the window for the tokens
        asks = [replace(a, cost=a.cost - self._reserved_cost) if a.limit is Limit.BUDGET else
                replace(a, cost=more, cap=_UNCAPPED)
                for a in token_asks(self.name, self.limits, self.prices, self.prompt, self.completion + more,
                                    time.time())]
        denied, store = await self.tenants.reserve(self.name, asks)
        if denied is not None:
            self.next_at = _NEVER
            self.tenants.counted(self.name, denied.limit.value)
            message = f"{denied.message}; the stream was stopped after {self.completion} tokens"
            if denied.retry_after_s is not None:
                message += f" (the budget starts again in {denied.retry_after_s} s)"
            return (b"data: " + json.dumps(error_body(message, denied.type, None, denied.code)).encode()
                    + b"\n\ndata: [DONE]\n\n")
        self.completion += more
        self.next_at = self.completion  # batch by batch from here: no closing slack
        self._store = store
        self._tokens = next((a for a in asks if a.limit is Limit.TOKENS), self._tokens)
        self._budget = next((a for a in asks if a.limit is Limit.BUDGET), self._budget)
        return None

    def room(self, produced: int) -> int:
        """Tokens still covered by what was reserved, after ``produced``."""
        return max(0, self.completion - produced)

    def close(self, prompt: int | None, completion: int, served: bool) -> None:
        """Settle once: the request used ``prompt`` (None: unknown, the estimate stands)
        and ``completion`` tokens; not ``served``: it cost nothing."""
        if self.closed:
            return
        self.closed = True
        if not served and not completion:
            prompt = 0
        elif prompt is None:
            prompt = self.prompt
        self.tenants.used(self.name, self.model, prompt, completion)
        changes = []
        if self._tokens is not None:
            changes.append((self._tokens, prompt + completion - self.prompt - self.completion))
        if self._budget is not None:
            changes.append((self._budget, budget_cost(self.limits, self.prices, prompt, completion)
                            - self._reserved_cost))
        changes = [(a, d) for a, d in changes if d]
        if self._store is not None and (changes or self._hold is not None):
            self.tenants.background(self._settle(self._store, changes))

    async def _settle(self, store: CounterStore, changes: list[tuple[Ask, int]]) -> None:
        try:
            await store.adjust(changes, self._hold)
        except Exception as e:  # noqa: BLE001 - the store went away: the reservation stands
            log.warning("settling key %r's usage failed (%s); its reservation stands", self.name, e)
            self.tenants.unreachable(e)


def first_events(events: bytes, n: int) -> bytes:
    """The first ``n`` SSE events of whole ``events`` (the relay counts a data event a token)."""
    end = 0
    for _ in range(n):
        i = events.find(b"\n\n", end)
        if i < 0:
            return events
        end = i + 2
    return events[:end]
