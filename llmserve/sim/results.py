"""What one simulated run produced: per-request outcomes, a timeline, and a summary.

The summary is what policies are compared on: SLO attainment counts every
request of the trace (a rejected or expired request missed its SLO), latency
percentiles cover completed requests, and cost is instance-hours billed over
the trace's duration, cold starts and draining included, and the same hours in
money at each capacity class's price (``autoscale.capacity``). A request cut at a
spot reclaim's deadline (``RECLAIMED``) missed both SLOs.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

from llmserve.autoscale.capacity_classes import CLASSES, ON_DEMAND
from llmserve.autoscale.config import SLOConfig
from llmserve.autoscale.usage import held_seconds
from llmserve.percentiles import percentile as _percentile
from llmserve.sim.traces import Trace

PENDING, COMPLETED, REJECTED, EXPIRED, RECLAIMED = 0, 1, 2, 3, 4


class TimelineRow(NamedTuple):
    """One tick as the controller saw it."""

    t: float
    arrival_rps: float
    arrival_tokens_per_s: float
    ready: int
    coming: int
    draining: int
    desired: int
    queued: int
    ttft_p99: float


TIMELINE_COLUMNS = TimelineRow._fields


@dataclass(frozen=True, slots=True)
class SimRecord:
    """What :meth:`Simulator.run` hands over: plain data, read by name."""

    label: str
    trace: Trace
    slo: SLOConfig
    status: np.ndarray
    ttft: np.ndarray
    e2e: np.ndarray
    timeline: list[TimelineRow]
    events: list[tuple[float, int, int, str]]  # (time, provisioned, desired, reason) of each change
    lifetimes: dict[Hashable, tuple[float, float | None]]  # (created, stopped) by instance
    classes: dict[Hashable, str]  # capacity class by instance
    prices_per_hour: dict[str, float]
    reclaims: int


def percentile(values: np.ndarray, q: float) -> float:
    """The project's percentile (nearest rank) of the values that are not NaN; NaN when none."""
    return _percentile(np.asarray(values, dtype=float), q, empty=float("nan"))


@dataclass(frozen=True, slots=True)
class Summary:
    """One row of the policy comparison table."""

    policy: str
    requests: int
    completed: int
    rejected: int
    expired: int
    ttft_slo_s: float
    e2e_slo_s: float
    ttft_attainment: float
    e2e_attainment: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    e2e_p50_s: float
    e2e_p99_s: float
    instance_hours: float
    mean_instances: float
    peak_instances: int
    scale_events: int
    duration_h: float
    wall_s: float
    cpu_s: float = float("nan")  # this process's CPU time: steadier than wall on a shared machine
    cost_dollars: float = float("nan")
    spot_hours: float = 0.0
    reclaims: int = 0
    reclaimed: int = 0  # requests cut at a reclaim's deadline

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(slots=True)
class SimResult:
    """Everything a run produced; ``summary`` is the comparable part."""

    summary: Summary
    arrival_s: np.ndarray
    status: np.ndarray
    ttft: np.ndarray
    e2e: np.ndarray
    timeline: np.ndarray  # rows of TIMELINE_COLUMNS
    events: list[tuple[float, int, int, str]]
    lifetimes: list[tuple[float, float | None]]  # (created, stopped) per instance

    def column(self, name: str) -> np.ndarray:
        return self.timeline[:, TIMELINE_COLUMNS.index(name)] if len(self.timeline) else np.zeros(0)

    @classmethod
    def build(cls, rec: SimRecord, wall_s: float, cpu_s: float = float("nan")) -> "SimResult":
        trace, slo = rec.trace, rec.slo
        duration = trace.duration_s
        lifetimes = list(rec.lifetimes.values())
        seconds = held_seconds(lifetimes, 0.0, duration)
        by_class = {c: held_seconds([span for iid, span in rec.lifetimes.items()
                                     if rec.classes.get(iid, ON_DEMAND) == c], 0.0, duration) / 3600.0
                    for c in CLASSES}
        timeline = np.array(rec.timeline, dtype=float) if rec.timeline else np.zeros((0, len(TIMELINE_COLUMNS)))
        col = {name: timeline[:, i] for i, name in enumerate(TIMELINE_COLUMNS)}
        n = max(len(trace), 1)
        cut = rec.status == RECLAIMED
        ttft_ok = (np.nan_to_num(rec.ttft, nan=np.inf) <= slo.ttft_s) & ~cut
        e2e_ok = (np.nan_to_num(rec.e2e, nan=np.inf) <= slo.e2e_s) & ~cut
        provisioned = col["ready"] + col["coming"] if len(timeline) else np.zeros(1)
        in_day = col["t"] <= duration if len(timeline) else np.ones(1, bool)
        summary = Summary(
            policy=rec.label,
            requests=len(trace),
            completed=int(np.sum(rec.status == COMPLETED)),
            rejected=int(np.sum(rec.status == REJECTED)),
            expired=int(np.sum(rec.status == EXPIRED)),
            ttft_slo_s=slo.ttft_s,
            e2e_slo_s=slo.e2e_s,
            ttft_attainment=float(np.sum(ttft_ok)) / n,
            e2e_attainment=float(np.sum(e2e_ok)) / n,
            ttft_p50_s=percentile(rec.ttft, 50),
            ttft_p90_s=percentile(rec.ttft, 90),
            ttft_p99_s=percentile(rec.ttft, 99),
            e2e_p50_s=percentile(rec.e2e, 50),
            e2e_p99_s=percentile(rec.e2e, 99),
            instance_hours=seconds / 3600.0,
            mean_instances=seconds / duration if duration > 0 else 0.0,
            peak_instances=int(provisioned[in_day].max()) if np.any(in_day) else 0,
            scale_events=len(rec.events),
            duration_h=duration / 3600.0,
            wall_s=wall_s,
            cpu_s=cpu_s,
            cost_dollars=sum(h * rec.prices_per_hour[c] for c, h in by_class.items()),
            spot_hours=by_class["spot"],
            reclaims=rec.reclaims,
            reclaimed=int(np.sum(cut)),
        )
        return cls(summary, trace.arrival_s, rec.status, rec.ttft, rec.e2e, timeline, list(rec.events), lifetimes)
