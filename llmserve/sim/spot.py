"""Capacity classes in the simulator: each instance's class and seeded spot reclaims.

The mix is the live controller's (:func:`~llmserve.autoscale.capacity_classes.plan_mix`,
the same inputs); a reclaim notice becomes the live controller's effects
(:func:`~llmserve.autoscale.effects.reclaim_effects`): the instance drains at
once and a replacement starts at once; at the deadline whatever is still running
on it is cut (those requests end ``RECLAIMED``, a miss for both SLOs) and it is
gone. The simulator applies both through the live executor.

Reclaims come as a Poisson process per spot instance, ``reclaim_rate_per_h``
(e.g. 0.05: 5 % of spot instances per hour), drawn from the run's seed. Spot is
always granted here (no refusals or slow starts are simulated).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from llmserve.autoscale.capacity_classes import ON_DEMAND, SPOT, CapacityConfig, plan_mix
from llmserve.autoscale.reconcile import InstanceStatus, ScalePlan, plan_scaling

if TYPE_CHECKING:
    from llmserve.sim.instance import SimInstance


class SimCapacity:
    """The class of every instance a run held, and its reclaim notices."""

    def __init__(self, cfg: CapacityConfig, base_default: int, reclaim_rate_per_h: float, reclaim_notice_s: float,
                 seed: int) -> None:
        self.cfg = cfg
        self.base_default = base_default
        self.rate_per_s = reclaim_rate_per_h / 3600.0
        self.notice_s = reclaim_notice_s
        self.rng = np.random.default_rng([seed, 0x5907])  # its own stream: arrivals stay the same
        self.classes: dict[Hashable, str] = {}
        self.reclaims = 0  # notices given
        self.horizon_s = float("inf")  # no notices drawn past it (the trace's end)

    def plan(self, desired: int, statuses: Sequence[InstanceStatus]) -> ScalePlan:
        # ``statuses`` leaves out instances under a notice (InstanceBook.statuses): never revived.
        if not self.cfg.spot_enabled:
            return plan_scaling(desired, statuses)
        return plan_mix(desired, statuses, self.classes, self.cfg, self.base_default, spot_ok=True)

    def start_classes(self, plan: ScalePlan) -> tuple[str, ...]:
        return plan.start_classes or (ON_DEMAND,) * plan.start

    def added(self, inst: SimInstance, capacity_class: str) -> float | None:
        """Record the class; the time of its reclaim notice, if it gets one."""
        self.classes[inst.id] = capacity_class
        if capacity_class != SPOT or self.rate_per_s <= 0:
            return None
        at = inst.created + float(self.rng.exponential(1.0 / self.rate_per_s))
        return at if at < self.horizon_s else None
