"""Passive health: outlier ejection by error rate, and the retry budget. Pure.

The circuit breaker (``circuit.py``) reacts to hard, consecutive failures; the
outlier detector catches an instance that fails a share of its requests while
still answering some. The retry budget keeps retries from multiplying load when
the whole pool is in trouble: retries may be at most ``ratio`` of recent
requests, plus ``min_per_s`` so that a quiet gateway can still retry.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field


class OutlierConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    window_s: float = Field(30.0, gt=0.0)
    min_requests: int = Field(20, ge=1)
    max_error_rate: float = Field(0.5, gt=0.0, le=1.0)
    ejection_s: float = Field(30.0, gt=0.0)  # doubled for each repeat ejection
    max_ejection_s: float = Field(300.0, gt=0.0)
    max_ejected_fraction: float = Field(0.5, ge=0.0, le=1.0)


@dataclass
class _Record:
    outcomes: deque[tuple[float, bool]] = field(default_factory=lambda: deque(maxlen=10_000))
    errors: int = 0  # failures among ``outcomes``, kept so a record is O(1), not O(window)
    ejected_until: float = 0.0
    ejections: int = 0


class OutlierDetector:
    def __init__(self, config: OutlierConfig | None = None) -> None:
        self.config = config or OutlierConfig()
        self._records: dict[str, _Record] = {}

    def is_ejected(self, instance_id: str, now: float) -> bool:
        rec = self._records.get(instance_id)
        return rec is not None and now < rec.ejected_until

    def record(self, instance_id: str, ok: bool, now: float, pool_size: int) -> bool:
        """Note one outcome; True if this ejected the instance."""
        rec = self._records.setdefault(instance_id, _Record())
        outcomes = rec.outcomes
        if len(outcomes) == outcomes.maxlen:  # append would drop the oldest unseen
            rec.errors -= not outcomes.popleft()[1]
        outcomes.append((now, ok))
        rec.errors += not ok
        while outcomes and outcomes[0][0] < now - self.config.window_s:
            rec.errors -= not outcomes.popleft()[1]
        if now < rec.ejected_until or len(outcomes) < self.config.min_requests:
            return False
        if rec.errors / len(outcomes) < self.config.max_error_rate:
            rec.ejections = 0  # a healthy full window forgives earlier ejections
            return False
        ejected = sum(1 for r in self._records.values() if now < r.ejected_until)
        if ejected + 1 > self.config.max_ejected_fraction * pool_size:
            return False  # never eject so many that the rest is overwhelmed
        rec.ejections += 1
        duration = min(self.config.ejection_s * 2 ** (rec.ejections - 1),
                       self.config.max_ejection_s)
        rec.ejected_until = now + duration
        rec.outcomes.clear()  # back from ejection, it is judged on fresh outcomes
        rec.errors = 0
        return True

    def forget(self, instance_id: str) -> None:
        self._records.pop(instance_id, None)


class RetryBudgetConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ratio: float = Field(0.2, ge=0.0)
    min_per_s: float = Field(1.0, ge=0.0)
    window_s: float = Field(10.0, gt=0.0)


class RetryBudget:
    """Retries ≤ ``ratio`` × requests + ``min_per_s`` × window, over the last window."""

    def __init__(self, config: RetryBudgetConfig | None = None) -> None:
        self.config = config or RetryBudgetConfig()
        self._buckets: deque[list[float]] = deque()  # [second, requests, retries]

    def record_request(self, now: float) -> None:
        self._bucket(now)[1] += 1

    def try_acquire(self, now: float) -> bool:
        """Spend one retry if the budget allows it."""
        bucket = self._bucket(now)
        requests = sum(b[1] for b in self._buckets)
        retries = sum(b[2] for b in self._buckets)
        allowed = self.config.ratio * requests + self.config.min_per_s * self.config.window_s
        if retries + 1 > allowed:
            return False
        bucket[2] += 1
        return True

    def _bucket(self, now: float) -> list[float]:
        second = float(int(now))
        while self._buckets and self._buckets[0][0] <= second - self.config.window_s:
            self._buckets.popleft()
        if not self._buckets or self._buckets[-1][0] != second:
            self._buckets.append([second, 0, 0])
        return self._buckets[-1]
