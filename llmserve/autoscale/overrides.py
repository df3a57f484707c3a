"""A pool's manual override: an operator's instance count, its expiry, its record."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from llmserve.autoscale.history import History
from llmserve.autoscale.scaling_step import Override


class ManualOverride:
    def __init__(self, max_instances: int, history: History, clock: Callable[[], float],
                 wall: Callable[[], float], labels: tuple[str, ...], metrics: Any = None) -> None:
        self.max_instances = max_instances
        self.history = history
        self.clock = clock
        self.wall = wall
        self.labels = labels
        self.metrics = metrics
        self.override: Override | None = None

    def active(self, now: float) -> Override | None:
        """The override in force at ``now``; one that expired is recorded and dropped."""
        o = self.override
        if o is not None and not o.in_force(now):
            self.history.event(self.wall(), "-", "override", f"{o.instances}", "expired", o.reason)
            self.override = o = None
        return o

    def set(self, instances: int | None, duration_s: float | None, reason: str) -> Override | None:
        """Pin the instance count (``None`` clears it); counted as a manual intervention."""
        max_n = self.max_instances
        if instances is not None and not 0 <= instances <= max_n:
            raise ValueError(f"instances must be in [0, {max_n}] (max_instances), got {instances}")
        if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
            raise ValueError(f"duration_s must be positive and finite, got {duration_s}")
        wall = self.wall()
        old = self.active(self.clock())  # the one replaced or cleared (an expired one is recorded as such)
        was = None if old is None else str(old.instances)
        if instances is None:
            self.override = None
            self.history.event(wall, "-", "override", was, "cleared", reason)
            action = "clear"
        else:
            until = None if duration_s is None else self.clock() + duration_s
            self.override = Override(instances, until, reason, wall)
            self.history.event(wall, "-", "override", was, str(instances), reason, duration_s=duration_s)
            action = "scale"
        if self.metrics is not None:
            self.metrics.manual.labels(*self.labels, action).inc()
        return self.override
