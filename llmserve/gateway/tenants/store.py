"""Where the limiter's counters live: the contract, and the in-memory store.

The in-memory store is the one-process default (no ``state.redis_url``) and a replica's
own share while Redis is away; ``redis_store.RedisStore`` keeps the same contract in
Redis for every replica at once. Both do exactly what this docstring says, nothing
more: the decisions are ``decision.py``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from llmserve.gateway.tenants.decision import Ask, Kind, Reply


class CounterStore(Protocol):
    """Counters of asks (``decision.Ask``), changed atomically.

    - ``reserve``: drop what has lapsed (window buckets older than ``oldest``, holds past
      their expiry), then, if every ask's counter plus its cost stays within its cap, add
      every cost (a window's to bucket ``field``, a hold as ``member`` until
      ``now + ttl_s``); else add nothing. ``Reply.used``: each counter before the costs.
    - ``adjust``: add each amount (negative gives back) to its ask's bucket, with no cap,
      and drop the hold of ``release``, if any.
    - ``used``: what each ask's counter holds now, changing nothing (the usage API).
    """

    async def reserve(self, asks: Sequence[Ask], now: float) -> Reply: ...

    async def adjust(self, changes: Sequence[tuple[Ask, int]], release: Ask | None) -> None: ...

    async def used(self, asks: Sequence[Ask], now: float) -> list[int]: ...

    async def close(self) -> None: ...


class MemoryStore:
    """The contract in this process's memory (asyncio: nothing runs between the steps)."""

    def __init__(self) -> None:
        self._windows: dict[str, dict[int, int]] = {}
        self._holds: dict[str, dict[str, float]] = {}

    def _count(self, ask: Ask, now: float) -> int:
        if ask.kind is Kind.HOLD:
            holds = self._holds.setdefault(ask.key, {})
            for member in [m for m, until in holds.items() if until <= now]:
                del holds[member]
            return len(holds)
        buckets = self._windows.setdefault(ask.key, {})
        for field in [f for f in buckets if f < ask.oldest]:
            del buckets[field]
        return sum(buckets.values())

    async def reserve(self, asks: Sequence[Ask], now: float) -> Reply:
        used = []
        for i, ask in enumerate(asks):
            used.append(self._count(ask, now))
            if used[-1] + ask.cost > ask.cap:
                pairs = () if ask.kind is Kind.HOLD else tuple(self._windows[ask.key].items())
                return Reply(i, tuple(used), pairs)
        for ask in asks:
            if ask.kind is Kind.HOLD:
                self._holds[ask.key][ask.member] = now + ask.ttl_s
            else:
                buckets = self._windows[ask.key]
                buckets[ask.field] = buckets.get(ask.field, 0) + ask.cost
        return Reply(-1, tuple(used))

    async def adjust(self, changes: Sequence[tuple[Ask, int]], release: Ask | None) -> None:
        for ask, amount in changes:
            buckets = self._windows.setdefault(ask.key, {})
            buckets[ask.field] = buckets.get(ask.field, 0) + amount
        if release is not None:
            self._holds.get(release.key, {}).pop(release.member, None)

    async def used(self, asks: Sequence[Ask], now: float) -> list[int]:
        return [self._count(ask, now) for ask in asks]

    async def close(self) -> None:
        pass
