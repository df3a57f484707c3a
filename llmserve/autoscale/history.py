"""What the controller did and saw, kept for people: events, decisions, a timeline.

Bounded ring buffers with a sequence number each, so the admin API and the
dashboard can ask for "everything after N" and a long-running server does not
grow without end. Times here are wall-clock (``time.time()``) seconds: they are
shown to people and compared with logs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Event:
    """A lifecycle transition (``kind="transition"``) or an action on an instance."""

    seq: int
    time: float
    instance_id: str
    kind: str  # transition | pool_add | pool_remove | stop | replace | override
    old: str | None
    new: str
    reason: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One tick's decision: how many instances, why, and whether it changed anything."""

    seq: int
    time: float
    provisioned: int
    desired: int
    reason: str
    source: str  # policy | manual
    policy_desired: int


class History:
    def __init__(self, max_events: int = 5000, max_decisions: int = 5000, max_samples: int = 3600) -> None:
        self._events: deque[Event] = deque(maxlen=max_events)
        self._decisions: deque[DecisionRecord] = deque(maxlen=max_decisions)
        self._changes: deque[DecisionRecord] = deque(maxlen=max_decisions)
        self._samples: deque[dict[str, Any]] = deque(maxlen=max_samples)
        self._seq = 0

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def event(self, time: float, instance_id: str, kind: str, old: str | None, new: str, reason: str,
              **details: Any) -> Event:
        e = Event(self._next(), time, instance_id, kind, old, new, reason, details)
        self._events.append(e)
        return e

    def decision(self, time: float, provisioned: int, desired: int, reason: str, source: str,
                 policy_desired: int) -> DecisionRecord:
        d = DecisionRecord(self._next(), time, provisioned, desired, reason, source, policy_desired)
        self._decisions.append(d)
        if desired != provisioned:
            self._changes.append(d)
        return d

    def sample(self, sample: dict[str, Any]) -> None:
        self._samples.append(sample)

    def events(self, since: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        return [asdict(e) for e in _tail(self._events, lambda e: e.seq > since, limit)]

    def decisions(self, since: int = 0, limit: int | None = None, changes_only: bool = False) -> list[dict[str, Any]]:
        src = self._changes if changes_only else self._decisions
        return [asdict(d) for d in _tail(src, lambda d: d.seq > since, limit)]

    def samples(self, since_time: float = 0.0, limit: int | None = None) -> list[dict[str, Any]]:
        return _tail(self._samples, lambda s: s["time"] > since_time, limit)

    def window(self, since: float, limit: int) -> dict[str, list[dict[str, Any]]]:
        """This pool on its model's timeline (``gateway/timeline.py``), newer than ``since``
        (wall seconds): instances by state and the desired count per tick, the scaling
        decisions that changed the count, and the events."""
        return {"samples": [{k: s[k] for k in ("time", "ready", "warming", "starting", "draining", "desired")}
                            for s in self.samples(since, limit)],
                "decisions": [d for d in self.decisions(limit=limit, changes_only=True) if d["time"] > since],
                "events": [e for e in self.events(limit=limit) if e["time"] > since]}


def _tail(items: deque, newer: Callable[[Any], bool], limit: int | None) -> list[Any]:
    """The newest items that pass ``newer`` (at most ``limit``), oldest first. Items are
    kept in order, so this walks back from the end and stops early: a dashboard that
    polls every second for the last 60 events does not touch the other thousands."""
    out = []
    for item in reversed(items):
        if not newer(item) or (limit and len(out) >= limit):  # 0 or None: no limit
            break
        out.append(item)
    out.reverse()
    return out

