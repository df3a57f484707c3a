"""A pool controller's capacity classes: the class of each start, the fall back to
on-demand, reclaim notices, and the cost by class. Part of
:class:`~llmserve.autoscale.controller.PoolController`; the decisions are
:mod:`llmserve.autoscale.capacity_mix`'s.

A reclaim notice (the provider's ``status`` gives ``reclaim_at``, or an operator
calls :meth:`CapacityActions.reclaim`) drains the instance at once and starts its
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
from dataclasses import replace

from llmserve.autoscale.capacity_mix import (CLASSES, ON_DEMAND, SPOT, plan_mix, replacement_class,
                                             spot_available)
from llmserve.lifecycle import InstanceState
from llmserve.autoscale.managed import ManagedInstance
from llmserve.autoscale.providers.base import InstanceHandle, RunStatus, SpotUnavailable
from llmserve.autoscale.reconcile import InstanceStatus, ScalePlan

log = logging.getLogger("llmserve.autoscale.controller")
S = InstanceState


class NoReclaim(RuntimeError):
    """The instance cannot be reclaimed: not found, not started, or the provider cannot."""


class CapacityActions:
    """What :class:`~llmserve.autoscale.controller.PoolController` does about capacity classes."""

    def _init_capacity(self) -> None:
        self._spot_setbacks: deque[float] = deque(maxlen=32)  # monotonic times of refusals, slow starts
        self.cost_dollars = {c: 0.0 for c in CLASSES}

    # ---- deciding ----------------------------------------------------------------------------
    def spot_ok(self, now: float) -> bool:
        cap = self.autoscale.capacity
        return cap.spot_enabled and spot_available(self._spot_setbacks, now, cap.spot_backoff_s)

    def _plan_mix(self, desired: int, statuses: Sequence[InstanceStatus]) -> ScalePlan:
        classes: dict[Hashable, str] = {i.id: i.capacity_class for i in self.instances.values()}
        return plan_mix(desired, statuses, classes, self.autoscale.capacity, self.autoscale.bounds.min_instances,
                        self.spot_ok(self.clock()))

    def _replacement_class(self, replaces: str | None) -> str:
        lost = next((i for i in (*self.instances.values(), *self.finished) if i.id == replaces), None)
        if lost is None:
            return ON_DEMAND
        return replacement_class(lost.capacity_class, self.autoscale.capacity, self.spot_ok(self.clock()))

    # ---- starting ----------------------------------------------------------------------------
    async def _provider_start(self, inst: ManagedInstance) -> InstanceHandle:
        """Start in the instance's class; refused spot falls back to on-demand at once."""
        spec = replace(self.spec_factory(inst.id), capacity_class=inst.capacity_class)
        try:
            return await self.provider.start(spec)
        except SpotUnavailable as e:
            if inst.capacity_class != SPOT:
                raise
            self._spot_setback(inst, "refused", f"spot refused ({e}); starting on-demand instead")
            inst.capacity_class = ON_DEMAND
            return await self.provider.start(replace(spec, capacity_class=ON_DEMAND))

    def _spot_setback(self, inst: ManagedInstance, kind: str, reason: str) -> None:
        self._spot_setbacks.append(self.clock())
        self.history.event(self.wall(), inst.id, "spot_fallback", SPOT, ON_DEMAND, reason)
        log.warning("%s: %s: %s", self.key, inst.id, reason)
        if self.metrics is not None:
            self.metrics.spot_fallbacks.labels(self.model, self.version, kind).inc()

    def _replace_slow_spot(self, now: float) -> None:
        limit = self.autoscale.capacity.spot_start_timeout_s
        for inst in list(self.instances.values()):
            if (inst.capacity_class == SPOT and inst.state in (S.STARTING, S.WARMING)
                    and inst.reclaim_at is None and now - inst.created > limit):
                self._spot_setback(inst, "slow", f"spot not ready in {limit:g}s; replaced on-demand")
                self._begin_stop(inst, f"spot not ready in {limit:g}s")
                self._launch(f"replaces {inst.id}, spot slow to start", now, replaces=inst.id,
                             capacity_class=ON_DEMAND)

    # ---- reclaims ----------------------------------------------------------------------------
    def _watch_capacity(self, live: Sequence[ManagedInstance], runs: Sequence[RunStatus], now: float) -> None:
        for inst, run in zip(live, runs):
            if run.reclaim_at is not None and inst.reclaim_at is None:
                self._on_reclaim(inst, run.reclaim_at, now)
        self._replace_slow_spot(now)

    def _on_reclaim(self, inst: ManagedInstance, at: float, now: float) -> None:
        """Drain now, replace now; the provider takes the instance at ``at`` (unix time)."""
        inst.reclaim_at = at
        notice = at - self.wall()
        capacity = inst.state.provisioned
        self.history.event(self.wall(), inst.id, "reclaim_notice", inst.state.value, inst.state.value,
                           f"the provider takes it in {notice:.1f}s", reclaim_at=at,
                           capacity_class=inst.capacity_class)
        if self.metrics is not None:
            self.metrics.reclaims.labels(self.model, self.version, inst.capacity_class).inc()
        if inst.state is S.STOPPING:
            pass
        elif inst.state is S.READY:
            self._transition(inst, S.DRAINING, f"reclaim notice: taken in {notice:.1f}s")
            inst.drain_started = now
            self.pool.set_draining(inst.id, True)
        elif inst.state in (S.STARTING, S.WARMING):
            self._begin_stop(inst, "reclaimed before it was ready")
        if capacity:
            self._launch(f"replaces {inst.id}, reclaimed", now, replaces=inst.id,
                         capacity_class=self._replacement_class(inst.id))

    async def reclaim(self, instance_id: str, notice_s: float) -> float:
        """Ask the provider to reclaim an instance (operators, tests, benchmarks): its
        deadline (unix time). Needs a provider with ``reclaim`` (the local one)."""
        inst = self.instances.get(instance_id)
        if inst is None or inst.handle is None:
            raise NoReclaim(f"no started instance {instance_id!r} in {self.key}")
        take = getattr(self.provider, "reclaim", None)
        if take is None:
            raise NoReclaim(f"the {self.provider.name} provider cannot simulate reclaims")
        at = await take(inst.handle, notice_s)
        if at is None:
            raise NoReclaim(f"instance {instance_id!r} is not running")
        if inst.reclaim_at is None and inst.id in self.instances:
            self._on_reclaim(inst, at, self.clock())
        return at

    # ---- cost ---------------------------------------------------------------------------------
    def class_counts(self) -> dict[str, int]:
        """Instances held (billed) by class."""
        out = {c: 0 for c in CLASSES}
        for i in self.instances.values():
            if i.state.billed:
                out[i.capacity_class] += 1
        return out

    def _bill_classes(self, seconds: float) -> None:
        cap = self.autoscale.capacity
        for c, n in self.class_counts().items():
            dollars = n * seconds * cap.price(c) / 3600.0
            self.cost_dollars[c] += dollars
            if self.metrics is not None and dollars:
                self.metrics.cost.labels(self.model, self.version, c).inc(dollars)
