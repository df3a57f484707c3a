"""Capacity classes in the simulator: each instance's class, seeded spot reclaims, and cost.

The mix is the live controller's (:func:`~llmserve.autoscale.capacity_mix.plan_mix`,
the same inputs); a reclaim is handled as the controller handles a notice
(:mod:`llmserve.autoscale.capacity_actions`): the instance drains at once and a
replacement starts at once; at the deadline whatever is still running on it is
cut (those requests end ``RECLAIMED``, a miss for both SLOs) and it is gone.

Reclaims come as a Poisson process per spot instance, ``reclaim_rate_per_h``
(e.g. 0.05: 5 % of spot instances per hour), drawn from the run's seed. Spot is
always granted here (no refusals or slow starts are simulated).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from llmserve.autoscale.capacity_mix import (CLASSES, ON_DEMAND, SPOT, CapacityConfig, plan_mix,
                                             replacement_class)
from llmserve.lifecycle import InstanceState
from llmserve.autoscale.reconcile import InstanceStatus, ScalePlan, plan_scaling
from llmserve.autoscale.usage import held_seconds

if TYPE_CHECKING:
    from llmserve.sim.instance import SimInstance
    from llmserve.sim.simulator import Simulator

S = InstanceState


class SimCapacity:
    """The class of every instance a run held, its reclaims and what it all cost."""

    def __init__(self, cfg: CapacityConfig, base_default: int, reclaim_rate_per_h: float, reclaim_notice_s: float,
                 seed: int) -> None:
        self.cfg = cfg
        self.base_default = base_default
        self.rate_per_s = reclaim_rate_per_h / 3600.0
        self.notice_s = reclaim_notice_s
        self.rng = np.random.default_rng([seed, 0x5907])  # its own stream: arrivals stay the same
        self.classes: dict[Hashable, str] = {}
        self.reclaimed: set[Hashable] = set()
        self.reclaims = 0
        self.cut = 0  # requests still running at a reclaim's deadline
        self.horizon_s = float("inf")  # no notices drawn past it (the trace's end)

    def plan(self, desired: int, statuses: Sequence[InstanceStatus]) -> ScalePlan:
        live = [s for s in statuses if s.id not in self.reclaimed]  # never revived: it is being taken
        if not self.cfg.spot_enabled:
            return plan_scaling(desired, live)
        return plan_mix(desired, live, self.classes, self.cfg, self.base_default, spot_ok=True)

    def start_classes(self, plan: ScalePlan) -> tuple[str, ...]:
        return plan.start_classes or (ON_DEMAND,) * plan.start

    def added(self, inst: SimInstance, capacity_class: str) -> float | None:
        """Record the class; the time of its reclaim notice, if it gets one."""
        self.classes[inst.id] = capacity_class
        if capacity_class != SPOT or self.rate_per_s <= 0:
            return None
        at = inst.created + float(self.rng.exponential(1.0 / self.rate_per_s))
        return at if at < self.horizon_s else None

    # ---- reclaims (events the simulator hands over) ---------------------------------------------
    def notice(self, sim: Simulator, inst: SimInstance, now: float) -> float | None:
        """Drain now and start the replacement now; the deadline, when there is one to keep."""
        if inst.id not in sim.instances:
            return None  # it stopped before its notice came
        self.reclaims += 1
        self.reclaimed.add(inst.id)
        capacity = inst.state.provisioned
        if inst.state is S.READY:
            sim._drain(inst, now)
        elif inst.state in (S.STARTING, S.WARMING):
            sim._stop(inst, now)
        if capacity:
            sim._new_instance(now, S.STARTING, replacement_class(SPOT, self.cfg, True))
        return now + self.notice_s if inst.id in sim.instances else None

    def deadline(self, sim: Simulator, inst: SimInstance, now: float, status: int) -> None:
        """The provider takes it: what still runs on it is cut."""
        if inst.id not in sim.instances:
            return
        for s in [*inst.running, *inst.waiting]:
            sim._finish(s.rid, status, now)
            self.cut += 1
        inst.running.clear()
        inst.waiting.clear()
        inst.kv_reserved = 0
        inst.version += 1  # its pending step event is stale now
        sim._stop(inst, now)

    # ---- cost ---------------------------------------------------------------------------------
    def held_hours(self, lifetimes: dict[Hashable, tuple[float, float | None]], t1: float) -> dict[str, float]:
        out = {}
        for c in CLASSES:
            spans = [span for iid, span in lifetimes.items() if self.classes.get(iid, ON_DEMAND) == c]
            out[c] = held_seconds(spans, 0.0, t1) / 3600.0
        return out

    def dollars(self, hours: dict[str, float]) -> float:
        return sum(h * self.cfg.price(c) for c, h in hours.items())
