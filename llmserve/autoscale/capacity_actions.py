"""A pool's capacity classes, live: the class of each start, the fall back to
on-demand, reclaim notices, and the cost by class. The decisions are
:mod:`llmserve.autoscale.capacity_classes`'s; what a notice does is
:func:`~llmserve.autoscale.effects.reclaim_effects`, the simulator's too.

A reclaim notice (the provider's ``status`` gives ``reclaim_at``, or an operator
asks the controller to ``reclaim``) drains the instance at once and starts its
replacement at once, not at the next tick: the notice (30 s to 2 min on the
clouds) is shorter than a tick plus a cold start. The requests in flight finish
during the notice; at the deadline the provider takes the instance, and the
controller sees it gone like any other exit (no second replacement: it was no
longer counted as capacity).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Hashable, Sequence
from typing import Any

from llmserve.autoscale.book import InstanceBook
from llmserve.autoscale.capacity_classes import (CLASSES, ON_DEMAND, SPOT, CapacityConfig, plan_mix,
                                             replacement_class, spot_available)
from llmserve.autoscale.effects import Effect, Start, Stop, reclaim_effects
from llmserve.autoscale.managed import ManagedInstance
from llmserve.autoscale.reconcile import InstanceStatus, ScalePlan, plan_scaling
from llmserve.lifecycle import InstanceState

log = logging.getLogger("llmserve.autoscale.controller")
S = InstanceState


class NoReclaim(RuntimeError):
    """The instance cannot be reclaimed: not found, not started, or the provider cannot."""


class CapacityLedger:
    """The classes of one pool's instances: spot setbacks, reclaim notices, cost."""

    def __init__(self, cfg: CapacityConfig, min_instances: int, book: InstanceBook[ManagedInstance],
                 metrics: Any = None, labels: tuple[str, ...] = (), name: str = "") -> None:
        self.cfg = cfg
        self.min_instances = min_instances
        self.book = book
        self.metrics = metrics
        self.labels = labels
        self.name = name
        self.setbacks: deque[float] = deque(maxlen=32)  # monotonic times of refusals, slow starts
        self.cost_dollars = {c: 0.0 for c in CLASSES}

    # ---- deciding ----------------------------------------------------------------------------
    def spot_ok(self, now: float) -> bool:
        return self.cfg.spot_enabled and spot_available(self.setbacks, now, self.cfg.spot_backoff_s)

    def plan(self, desired: int, statuses: Sequence[InstanceStatus]) -> ScalePlan:
        """Which instances to act on: by capacity class when spot is on."""
        if not self.cfg.spot_enabled:
            return plan_scaling(desired, statuses)
        classes: dict[Hashable, str] = self.book.classes()
        return plan_mix(desired, statuses, classes, self.cfg, self.min_instances, self.spot_ok(self.book.clock()))

    def replacement_class(self, replaces: Hashable | None) -> str:
        lost = self.book.find(replaces) if replaces is not None else None
        if lost is None:
            return ON_DEMAND
        return replacement_class(lost.capacity_class, self.cfg, self.spot_ok(self.book.clock()))

    # ---- setbacks ----------------------------------------------------------------------------
    def setback(self, inst: ManagedInstance, kind: str, reason: str) -> None:
        self.setbacks.append(self.book.clock())
        self.book.event(inst.id, "spot_fallback", SPOT, ON_DEMAND, reason)
        log.warning("%s: %s: %s", self.name, inst.id, reason)
        if self.metrics is not None:
            self.metrics.spot_fallbacks.labels(*self.labels, kind).inc()

    def slow_spot(self, now: float) -> list[list[Effect]]:
        """Spot starts not ready in time: each one's stop and its on-demand replacement."""
        limit = self.cfg.spot_start_timeout_s
        out = []
        for inst in self.book:
            if (inst.capacity_class == SPOT and inst.state in (S.STARTING, S.WARMING)
                    and inst.reclaim_at is None and now - inst.created > limit):
                self.setback(inst, "slow", f"spot not ready in {limit:g}s; replaced on-demand")
                out.append([Stop(inst.id, f"spot not ready in {limit:g}s"),
                            Start(f"replaces {inst.id}, spot slow to start", ON_DEMAND, replaces=inst.id)])
        return out

    # ---- reclaims ----------------------------------------------------------------------------
    def notice(self, inst: ManagedInstance, at: float) -> list[Effect]:
        """A reclaim notice: the provider takes ``inst`` at ``at`` (unix time)."""
        inst.reclaim_at = at
        notice = at - self.book.wall()
        self.book.event(inst.id, "reclaim_notice", inst.state.value, inst.state.value,
                        f"the provider takes it in {notice:.1f}s", reclaim_at=at, capacity_class=inst.capacity_class)
        if self.metrics is not None:
            self.metrics.reclaims.labels(*self.labels, inst.capacity_class).inc()
        return reclaim_effects(inst.id, inst.state, notice, self.replacement_class(inst.id))

    # ---- cost ---------------------------------------------------------------------------------
    def class_counts(self) -> dict[str, int]:
        return self.book.class_counts(CLASSES)

    def bill(self, seconds: float) -> None:
        for c, n in self.class_counts().items():
            dollars = n * seconds * self.cfg.price(c) / 3600.0
            self.cost_dollars[c] += dollars
            if self.metrics is not None and dollars:
                self.metrics.cost.labels(*self.labels, c).inc(dollars)

