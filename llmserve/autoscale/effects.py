"""What a decision does to instances, as data: effects, and the pure functions that make them.

A scaling plan, a probe's answer, a drain's progress and a reclaim notice each
become a list of effects; one :class:`~llmserve.autoscale.executor.Executor`
carries them out, live (through a provider) and in the simulator (through
simulated instances) alike. So the two cannot go separate ways in the order of
a plan's actions or in what a reclaim does: both run these functions and that
executor.

- :class:`Start`: a new instance (``replaces``: the one it stands in for);
- :class:`Undrain`: a draining instance back into service (warm: no cold start);
- :class:`Drain`: no new requests; it stops once nothing is in flight;
- :class:`Stop`: out of the pool and stopped (a cancelled start, a finished drain);
- :class:`Advance`: a start's progress (``warming``, ``ready``: joins the pool);
- :class:`Fail`: gone or broken; replaced when it was capacity.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmserve.autoscale.capacity_classes import ON_DEMAND
from llmserve.autoscale.probe import Probe, judge
from llmserve.autoscale.reconcile import ScalePlan
from llmserve.lifecycle import InstanceState

S = InstanceState


@dataclass(frozen=True, slots=True)
class Start:
    reason: str
    capacity_class: str = ON_DEMAND
    replaces: Hashable | None = None


@dataclass(frozen=True, slots=True)
class Undrain:
    id: Hashable
    reason: str


@dataclass(frozen=True, slots=True)
class Drain:
    id: Hashable
    reason: str


@dataclass(frozen=True, slots=True)
class Stop:
    id: Hashable
    reason: str
    details: dict[str, Any] = field(default_factory=dict)  # kept with the transition's event


@dataclass(frozen=True, slots=True)
class Advance:
    id: Hashable
    to: InstanceState  # warming or ready; the states between are passed through
    reason: str


@dataclass(frozen=True, slots=True)
class Fail:
    id: Hashable
    reason: str


Effect = Start | Undrain | Drain | Stop | Advance | Fail


def plan_effects(plan: ScalePlan, reason: str) -> list[Effect]:
    """A tick's plan in the order it is carried out: revivals first (warm capacity at
    once), then cancelled starts and drains, then new starts."""
    out: list[Effect] = [Undrain(i, f"revived: {reason}") for i in plan.revive]
    out += [Stop(i, f"cancelled: {reason}") for i in plan.cancel]
    out += [Drain(i, reason) for i in plan.drain]
    out += [Start(reason, c) for c in (plan.start_classes or (ON_DEMAND,) * plan.start)[:plan.start]]
    return out


def probe_effects(iid: Hashable, state: InstanceState, probe: Probe, age_s: float,
                  start_timeout_s: float) -> list[Effect]:
    """What a ``/ready`` answer does to an instance (:func:`~llmserve.autoscale.probe.judge`)."""
    verdict = judge(state, probe, age_s, start_timeout_s)
    if verdict is None:
        return []
    target, reason = verdict
    return [Fail(iid, reason) if target is S.FAILED else Advance(iid, target, reason)]


@dataclass(frozen=True, slots=True)
class Draining:
    """One draining instance as :func:`drain_effects` sees it."""

    id: Hashable
    gateway_in_flight: int
    engine_in_flight: int | None  # None: the engine did not report
    waited_s: float


def drain_effects(draining: Sequence[Draining], timeout_s: float) -> list[Effect]:
    """Stop the drained instances, and those past the drain timeout."""
    out: list[Effect] = []
    for d in draining:
        if d.gateway_in_flight == 0 and d.engine_in_flight == 0:
            out.append(Stop(d.id, f"drained in {d.waited_s:.1f}s", {"in_flight": 0}))
        elif d.waited_s > timeout_s:
            out.append(Stop(d.id, f"drain timeout after {d.waited_s:.0f}s",
                            {"in_flight": d.gateway_in_flight, "engine_in_flight": d.engine_in_flight}))
    return out


def reclaim_effects(iid: Hashable, state: InstanceState, notice_s: float, replacement: str) -> list[Effect]:
    """A reclaim notice: drain now (or cancel a start), and start the replacement now,
    not at the next tick: the notice is shorter than a tick plus a cold start."""
    out: list[Effect] = []
    if state is S.READY:
        out.append(Drain(iid, f"reclaim notice: taken in {notice_s:.1f}s"))
    elif state in (S.STARTING, S.WARMING):
        out.append(Stop(iid, "reclaimed before it was ready"))
    if state.provisioned:
        out.append(Start(f"replaces {iid}, reclaimed", replacement, replaces=iid))
    return out
