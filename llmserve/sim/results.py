"""What one simulated run produced: per-request outcomes, a timeline, and a summary.

The summary is what policies are compared on: SLO attainment counts every
request of the trace (a rejected or expired request missed its SLO), latency
percentiles cover completed requests, and cost is instance-hours billed over
the trace's duration, cold starts and draining included, and the same hours in
money at each capacity class's price (``autoscale.capacity``). A request cut at a
spot reclaim's deadline (``RECLAIMED``) missed both SLOs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from llmserve.autoscale.usage import held_seconds

if TYPE_CHECKING:
    from llmserve.sim.simulator import Simulator

PENDING, COMPLETED, REJECTED, EXPIRED, RECLAIMED = 0, 1, 2, 3, 4

TIMELINE_COLUMNS = ("t", "arrival_rps", "arrival_tokens_per_s", "ready", "coming", "draining", "desired",
                    "queued", "ttft_p99")


def percentile(values: np.ndarray, q: float) -> float:
    """numpy's linear percentile over the values that are not NaN (NaN when there are none)."""
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    return float(np.percentile(values, q)) if len(values) else float("nan")


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
    def build(cls, sim: "Simulator", wall_s: float, cpu_s: float = float("nan")) -> "SimResult":
        trace, slo = sim.trace, sim.autoscale.slo
        duration = trace.duration_s
        held = {i.id: (i.created, i.stopped_at) for i in [*sim.stopped, *sim.instances.values()]}
        lifetimes = list(held.values())
        seconds = held_seconds(lifetimes, 0.0, duration)
        by_class = sim.capacity.held_hours(held, duration)
        timeline = np.array(sim.timeline, dtype=float) if sim.timeline else np.zeros((0, len(TIMELINE_COLUMNS)))
        n = max(len(trace), 1)
        cut = sim.status == RECLAIMED
        ttft_ok = (np.nan_to_num(sim.ttft, nan=np.inf) <= slo.ttft_s) & ~cut
        e2e_ok = (np.nan_to_num(sim.e2e, nan=np.inf) <= slo.e2e_s) & ~cut
        provisioned = timeline[:, 3] + timeline[:, 4] if len(timeline) else np.zeros(1)
        in_day = timeline[:, 0] <= duration if len(timeline) else np.ones(1, bool)
        summary = Summary(
            policy=sim.label,
            requests=len(trace),
            completed=int(np.sum(sim.status == COMPLETED)),
            rejected=int(np.sum(sim.status == REJECTED)),
            expired=int(np.sum(sim.status == EXPIRED)),
            ttft_slo_s=slo.ttft_s,
            e2e_slo_s=slo.e2e_s,
            ttft_attainment=float(np.sum(ttft_ok)) / n,
            e2e_attainment=float(np.sum(e2e_ok)) / n,
            ttft_p50_s=percentile(sim.ttft, 50),
            ttft_p90_s=percentile(sim.ttft, 90),
            ttft_p99_s=percentile(sim.ttft, 99),
            e2e_p50_s=percentile(sim.e2e, 50),
            e2e_p99_s=percentile(sim.e2e, 99),
            instance_hours=seconds / 3600.0,
            mean_instances=seconds / duration if duration > 0 else 0.0,
            peak_instances=int(provisioned[in_day].max()) if np.any(in_day) else 0,
            scale_events=len(sim.events),
            duration_h=duration / 3600.0,
            wall_s=wall_s,
            cpu_s=cpu_s,
            cost_dollars=sim.capacity.dollars(by_class),
            spot_hours=by_class["spot"],
            reclaims=sim.capacity.reclaims,
            reclaimed=int(np.sum(cut)),
        )
        return cls(summary, trace.arrival_s, sim.status.copy(), sim.ttft.copy(), sim.e2e.copy(), timeline,
                   list(sim.events), lifetimes)
