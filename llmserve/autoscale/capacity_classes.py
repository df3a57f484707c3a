"""Capacity classes (on-demand and spot): how many of each to hold, purely.

The policy says how many instances; :func:`plan_scaling` says which to start,
revive, cancel or drain; this module splits both by capacity class. The live
controller and the simulator call the same :func:`plan_mix`, so they buy the
same mix.

The split (:func:`target_mix`): the base (``on_demand.min_instances``) stays on
on-demand, so a wave of spot reclaims never takes the pool below it; the burst
above it goes to spot up to ``spot.max_instances``; the rest to on-demand. While
spot is refused or slow to start (:func:`spot_available`), no new spot is
planned: the spot instances already held are kept, and new capacity is
on-demand.

Scale-down drains on-demand instances above the base first, then spot. The
on-demand ones above the base are fallbacks bought while spot was refused: they
cost the most (about three spot instances each at a typical 65 % discount),
and the base that keeps the pool safe from reclaims is never touched. Draining
spot first would only lower the reclaim exposure, and a reclaim costs a drain
and one replacement's cold start, far less than the price gap.

Scale-up revives draining instances first, whatever their class (warm capacity
beats a cold start of the cheaper class), then starts the missing ones, spot
first. An equal count never swaps classes: a swap is a cold start and a drain
for a saving that the next scale-down makes anyway.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace

from pydantic import BaseModel, ConfigDict, model_validator

from llmserve.autoscale.reconcile import InstanceStatus, ScalePlan, plan_scaling

ON_DEMAND, SPOT = "on_demand", "spot"
CLASSES = (ON_DEMAND, SPOT)


def _check(ok: bool, name: str, msg: str) -> None:
    if not ok:
        raise ValueError(f"autoscale config: capacity.{name} {msg}")


class ClassConfig(BaseModel):
    """One capacity class: its price and its bounds (``None``: no bound beyond the pool's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    price_per_hour: float = 1.0
    min_instances: int | None = None  # on_demand: the base (None: bounds.min_instances); spot: 0
    max_instances: int | None = None

    @model_validator(mode="after")
    def _checked(self) -> ClassConfig:
        _check(self.price_per_hour >= 0, "price_per_hour", f"must be >= 0, got {self.price_per_hour}")
        _check(self.min_instances is None or self.min_instances >= 0, "min_instances", "must be >= 0")
        _check(self.max_instances is None or self.max_instances >= (self.min_instances or 0), "max_instances",
               "must be >= min_instances")
        return self


class SpotConfig(ClassConfig):
    """Spot: a typical 65 % discount, and none unless the file asks (``max_instances: 0``)."""

    price_per_hour: float = 0.35
    max_instances: int | None = 0


class CapacityConfig(BaseModel):
    """The pool's capacity classes. The default holds no spot: every instance on-demand."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    on_demand: ClassConfig = ClassConfig()
    spot: SpotConfig = SpotConfig()
    # A spot instance not ready this long after its start is replaced on on-demand.
    spot_start_timeout_s: float = 300.0
    # After a refusal or a slow start, no new spot instance for this long.
    spot_backoff_s: float = 600.0

    @model_validator(mode="after")
    def _checked(self) -> CapacityConfig:
        _check(self.spot_start_timeout_s > 0, "spot_start_timeout_s", "must be positive")
        _check(self.spot_backoff_s >= 0, "spot_backoff_s", "must be >= 0")
        _check(not self.spot.min_instances, "spot.min_instances", "must be 0: the base is on_demand.min_instances")
        return self

    @property
    def spot_enabled(self) -> bool:
        return self.spot.max_instances is None or self.spot.max_instances > 0

    def price(self, capacity_class: str) -> float:
        return self.spot.price_per_hour if capacity_class == SPOT else self.on_demand.price_per_hour


@dataclass(frozen=True, slots=True)
class Mix:
    on_demand: int
    spot: int

    def of(self, capacity_class: str) -> int:
        return self.spot if capacity_class == SPOT else self.on_demand


def spot_available(setbacks: Sequence[float], now: float, backoff_s: float) -> bool:
    """No spot refusal or slow spot start within the last ``backoff_s``."""
    return not any(now - t < backoff_s for t in setbacks)


def target_mix(desired: int, cfg: CapacityConfig, base_default: int, spot_ok: bool, spot_held: int) -> Mix:
    """How many of ``desired`` go to each class (fewer in all only if both classes are capped)."""
    od_min = cfg.on_demand.min_instances if cfg.on_demand.min_instances is not None else base_default
    od_max = math.inf if cfg.on_demand.max_instances is None else cfg.on_demand.max_instances
    spot_max = math.inf if cfg.spot.max_instances is None else cfg.spot.max_instances
    if not spot_ok:
        spot_max = min(spot_max, spot_held)
    od = min(desired, od_min)
    spot = int(min(desired - od, spot_max))
    return Mix(int(min(desired - spot, od_max)), spot)


def plan_mix(desired: int, instances: Sequence[InstanceStatus], classes: Mapping[Hashable, str],
             cfg: CapacityConfig, base_default: int, spot_ok: bool) -> ScalePlan:
    """:func:`plan_scaling` with each start given a class (``start_classes``) and the
    scale-down taken from the class above its target first (see the module docstring)."""
    provisioned = [i for i in instances if i.state.provisioned]
    held = {c: sum(1 for i in provisioned if classes[i.id] == c) for c in CLASSES}
    mix = target_mix(desired, cfg, base_default, spot_ok, held[SPOT])
    n = len(provisioned)
    if desired > n:
        plan = plan_scaling(desired, instances)
        for iid in plan.revive:
            held[classes[iid]] += 1
        spot = min(plan.start, max(0, mix.spot - held[SPOT]))
        od = min(plan.start - spot, max(0, mix.on_demand - held[ON_DEMAND]))
        return replace(plan, start=spot + od, start_classes=(SPOT,) * spot + (ON_DEMAND,) * od)
    if desired < n:
        excess = n - desired
        cut = {ON_DEMAND: min(excess, max(0, held[ON_DEMAND] - mix.on_demand))}
        cut[SPOT] = min(excess - cut[ON_DEMAND], held[SPOT])
        cut[ON_DEMAND] += excess - cut[ON_DEMAND] - cut[SPOT]
        cancel: list[Hashable] = []
        drain: list[Hashable] = []
        for c in CLASSES:
            own = [i for i in instances if classes[i.id] == c]
            p = plan_scaling(held[c] - cut[c], own)
            cancel += p.cancel
            drain += p.drain
        return ScalePlan(cancel=cancel, drain=drain)
    return ScalePlan()


def replacement_class(lost: str, cfg: CapacityConfig, spot_ok: bool) -> str:
    """The class of an instance started in place of a lost one (failed or reclaimed)."""
    return SPOT if lost == SPOT and spot_ok and cfg.spot_enabled else ON_DEMAND
