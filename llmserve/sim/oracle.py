"""The oracle: the fewest instance-hours that meet the SLO, knowing the whole trace.

A policy is judged against what was possible, not only against another policy. The
oracle knows every arrival and the cold start, so it starts each instance exactly
a cold start before its bin needs it and stops it the moment its bin is over; what
it cannot escape is the physics the simulator models (cold starts are paid,
requests run at the instances' speed).

Its schedule is a count per bin, found offline: it starts at the fluid lower bound
(each bin's offered tokens over one instance's saturation throughput), simulates,
adds an instance to every bin whose own requests missed the SLO more than the
target allows, and repeats; then it tries taking one away from bins that met it
with room to spare and keeps each removal the simulation accepts. A greedy search,
so an upper bound on the true minimum, and a tight one in practice: it never holds
an instance a bin's own requests did not need.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from llmserve.autoscale import AutoscaleConfig, BoundsConfig
from llmserve.autoscale.policy import Decision
from llmserve.autoscale.signals import PoolSignals
from llmserve.sim.profile import InstanceProfile
from llmserve.sim.results import SimResult
from llmserve.sim.simulator import SimConfig, Simulator
from llmserve.sim.traces import Trace


@dataclass(frozen=True, slots=True)
class SchedulePolicy:
    """Replays a count per bin, each started ``lead_s`` ahead of its bin."""

    counts: tuple[int, ...]
    bin_s: float
    lead_s: float

    def initial_state(self) -> None:
        return None

    def desired_at(self, t: float) -> int:
        first = int(t // self.bin_s)
        last = int((t + self.lead_s) // self.bin_s)
        hi = len(self.counts) - 1
        return max(self.counts[min(max(b, 0), hi)] for b in range(first, last + 1))

    def decide(self, ctx: PoolSignals, state: None) -> Decision:
        return Decision(self.desired_at(ctx.now), None, "oracle schedule")


def fluid_counts(trace: Trace, profile: InstanceProfile, bin_s: float) -> list[int]:
    """Per bin: offered prompt + output tokens over one instance's saturation throughput."""
    bins = max(1, math.ceil(trace.duration_s / bin_s))
    tokens = np.zeros(bins)
    idx = np.minimum((trace.arrival_s // bin_s).astype(int), bins - 1)
    np.add.at(tokens, idx, trace.prompt_tokens + trace.output_tokens)
    mean_p = float(np.mean(trace.prompt_tokens)) if len(trace) else 1.0
    mean_o = float(np.mean(trace.output_tokens)) if len(trace) else 1.0
    per_instance = profile.saturation_tokens_per_s(mean_p, mean_o) * bin_s
    return [max(1, math.ceil(t / per_instance)) for t in tokens]


def bin_misses(result: SimResult, slo_s: float, bin_s: float, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Requests per arrival bin, and those that missed the TTFT SLO (or never completed)."""
    idx = np.minimum((result.arrival_s // bin_s).astype(int), bins - 1)
    late = ~(np.nan_to_num(result.ttft, nan=np.inf) <= slo_s)
    return np.bincount(idx, minlength=bins), np.bincount(idx, weights=late, minlength=bins)


def oracle(trace: Trace, profile: InstanceProfile, autoscale: AutoscaleConfig, sim: SimConfig | None = None,
           target: float = 0.999, bin_s: float = 300.0, max_rounds: int = 12,
           log: Callable[[str], None] | None = None) -> SimResult:
    """The cheapest schedule found that meets ``target`` TTFT attainment, as a run."""
    sim = sim or SimConfig()
    lead = profile.cold_start_s + autoscale.tick_s
    # No bounds: the oracle's schedule is the decision (min 0 lets a silent bin go).
    cfg = autoscale.model_copy(update={"bounds": BoundsConfig(min_instances=0, max_instances=10_000)})
    slo = autoscale.slo.ttft_s
    counts = fluid_counts(trace, profile, bin_s)
    bins = len(counts)

    def run(c: list[int]) -> SimResult:
        policy = SchedulePolicy(tuple(c), bin_s, lead)
        return Simulator(trace, profile, cfg, sim.model_copy(update={"initial_instances": c[0]}), label="oracle",
                         policy=policy).run()

    def say(what: str, r: SimResult) -> None:
        if log:
            log(f"oracle {what}: {r.summary.ttft_attainment:.3%} within SLO, "
                f"{r.summary.instance_hours:.1f} instance-hours")

    allowed = 1.0 - target
    best: tuple[list[int], SimResult] | None = None
    for i in range(max_rounds):
        res = run(counts)
        say(f"round {i + 1}", res)
        n, late = bin_misses(res, slo, bin_s, bins)
        if res.summary.ttft_attainment >= target:
            best = (list(counts), res)
            break
        grow = [b for b in range(bins) if n[b] and late[b] / n[b] > allowed / 2]
        if not grow:
            grow = [int(np.argmax(late))]
        for b in grow:
            counts[b] += 1
    if best is None:
        best = (list(counts), run(counts))
        say("gave up growing", best[1])
        return best[1]
    # Shrink: one instance off each bin that met the SLO outright, kept where the run still passes.
    counts, res = best
    n, late = bin_misses(res, slo, bin_s, bins)
    trial = [c - 1 if c > 1 and n[b] and late[b] == 0 else c for b, c in enumerate(counts)]
    if trial != counts:
        shrunk = run(trial)
        say("shrunk", shrunk)
        if shrunk.summary.ttft_attainment >= target:
            return shrunk
    return res
