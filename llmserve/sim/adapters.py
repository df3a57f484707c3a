"""LoRA adapters in a simulated pool: which requests run on one, and what a load costs.

A request on an adapter goes through the live placement rule (the picker's
``gateway/balancer/adapter.py``: where it is resident, else the least loaded);
on an instance that lacks it, the request waits ``load_s`` while it loads, and
the requests for it that follow there wait for the same load. With
``max_resident`` (the engines' ``--max-cpu-loras``) the least recently used
adapter is dropped to make room, so the next request for it loads it again.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator


class SimAdapters(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    shares: dict[str, float]  # adapter name -> share of the requests; the rest run on the base
    # Seconds from a load's start until the adapter serves: issue 31's target for a
    # rank-16 SmolLM2 adapter is <= 200 ms.
    load_s: float = Field(0.2, ge=0.0)
    max_resident: int | None = Field(None, ge=1)

    @field_validator("shares")
    @classmethod
    def _shares(cls, shares: dict[str, float]) -> dict[str, float]:
        if any(s < 0 for s in shares.values()) or sum(shares.values()) > 1 + 1e-9:
            raise ValueError("adapter shares are >= 0 and sum to at most 1")
        return shares

    def assign(self, n: int, seed: int) -> list[str | None]:
        """Each of ``n`` requests' adapter (None: the base), drawn with the shares, seeded."""
        names: list[str | None] = [*self.shares, None]
        p = [*self.shares.values(), max(0.0, 1.0 - sum(self.shares.values()))]
        picks = np.random.default_rng(seed).choice(len(names), size=n, p=np.array(p) / sum(p))
        return [names[i] for i in picks]


class Resident:
    """One simulated instance's adapters: name -> the time it serves from (LRU order)."""

    __slots__ = ("_at", "_max")

    def __init__(self, max_resident: int | None) -> None:
        self._at: OrderedDict[str, float] = OrderedDict()
        self._max = max_resident

    def names(self) -> frozenset[str]:
        return frozenset(self._at)

    def serve_at(self, name: str, now: float, load_s: float) -> float:
        """When a request on ``name`` arriving now can start: once it is loaded."""
        at = self._at.pop(name, None)
        if at is None:
            at = now + load_s
        self._at[name] = at  # most recently used
        if self._max is not None:
            while len(self._at) > self._max:
                self._at.popitem(last=False)
        return at
