"""A circuit breaker per upstream instance, pure (time is passed in).

closed ── ``failure_threshold`` consecutive failures ──▶ open
open ── ``cooloff`` elapsed ──▶ half-open (one probe request may go)
half-open ── probe succeeds ──▶ closed
half-open ── probe fails ──▶ open, with the cool-off doubled (up to ``max_cooloff_s``)

A probe that never reports (its client vanished) frees the slot again after
``probe_timeout_s``. Outcomes that arrive while open come from requests sent
before it opened and are ignored.
"""

from __future__ import annotations

import enum

from pydantic import BaseModel, ConfigDict, Field


class BreakerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    failure_threshold: int = Field(5, ge=1)
    cooloff_s: float = Field(5.0, gt=0.0)
    max_cooloff_s: float = Field(60.0, gt=0.0)
    probe_timeout_s: float = Field(30.0, gt=0.0)


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


TRANSITIONS: dict[BreakerState, frozenset[BreakerState]] = {
    BreakerState.CLOSED: frozenset({BreakerState.OPEN}),
    BreakerState.OPEN: frozenset({BreakerState.HALF_OPEN}),
    BreakerState.HALF_OPEN: frozenset({BreakerState.CLOSED, BreakerState.OPEN}),
}


class CircuitBreaker:
    def __init__(self, config: BreakerConfig | None = None) -> None:
        self.config = config or BreakerConfig()
        self._state = BreakerState.CLOSED
        self._failures = 0  # consecutive, while closed
        self._opened_at = 0.0
        self._cooloff = self.config.cooloff_s
        self._probe_started: float | None = None
        self.times_opened = 0

    def state(self, now: float) -> BreakerState:
        if self._state is BreakerState.OPEN and now - self._opened_at >= self._cooloff:
            self._move(BreakerState.HALF_OPEN)
            self._probe_started = None
        return self._state

    def available(self, now: float) -> bool:
        """Would a request be let through now? (No side effect on the probe slot.)"""
        state = self.state(now)
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.OPEN:
            return False
        return self._probe_free(now)

    def acquire(self, now: float) -> bool:
        """Let a request through, taking the half-open probe slot if that is the state."""
        if not self.available(now):
            return False
        if self._state is BreakerState.HALF_OPEN:
            self._probe_started = now
        return True

    def record_success(self, now: float) -> BreakerState:
        state = self.state(now)
        if state is BreakerState.CLOSED:
            self._failures = 0
        elif state is BreakerState.HALF_OPEN:
            self._move(BreakerState.CLOSED)
            self._failures = 0
            self._cooloff = self.config.cooloff_s
            self._probe_started = None
        return self._state

    def record_failure(self, now: float) -> BreakerState:
        state = self.state(now)
        if state is BreakerState.CLOSED:
            self._failures += 1
            if self._failures >= self.config.failure_threshold:
                self._open(now)
        elif state is BreakerState.HALF_OPEN:
            self._cooloff = min(self._cooloff * 2, self.config.max_cooloff_s)
            self._open(now)
        return self._state

    def reopens_in(self, now: float) -> float:
        """Seconds until an open breaker lets a probe through (0 when not open)."""
        if self.state(now) is not BreakerState.OPEN:
            return 0.0
        return self._opened_at + self._cooloff - now

    def _probe_free(self, now: float) -> bool:
        return (self._probe_started is None
                or now - self._probe_started >= self.config.probe_timeout_s)

    def _open(self, now: float) -> None:
        self._move(BreakerState.OPEN)
        self._opened_at = now
        self._probe_started = None
        self.times_opened += 1

    def _move(self, to: BreakerState) -> None:
        if to not in TRANSITIONS[self._state]:
            raise RuntimeError(f"breaker cannot go from {self._state.value} to {to.value}")
        self._state = to
