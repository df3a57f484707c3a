"""Run several policies over one trace, and size the static baseline for the peak.

The comparison is only fair if every policy gets the same trace, instance
profile, SLO, bounds and gateway, and the static pool it is priced against is
the one a capacity planner would buy: the smallest fixed pool that meets the
TTFT SLO during the busiest hour (:func:`size_static_for_peak`).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from llmserve.autoscale import AutoscaleConfig, StaticConfig
from llmserve.sim.jobs import run_many
from llmserve.sim.profile import InstanceProfile
from llmserve.sim.results import SimResult
from llmserve.sim.simulator import SimConfig, Simulator
from llmserve.sim.traces import Trace


def demand_tokens_per_s(trace: Trace) -> float:
    """Mean prompt + output tokens per request times the peak arrival rate."""
    if not len(trace):
        return 0.0
    per_request = float(np.mean(trace.prompt_tokens) + np.mean(trace.output_tokens))
    return trace.peak_rps * per_request


def peak_window(trace: Trace, window_s: float = 3600.0) -> tuple[float, float]:
    """The ``window_s`` around the highest point of the (smoothed) rate curve."""
    if not len(trace.rate_t):
        return 0.0, min(window_s, trace.duration_s)
    step = float(np.median(np.diff(trace.rate_t))) if len(trace.rate_t) > 1 else window_s
    k = max(1, int(round(window_s / step)))
    smooth = np.convolve(trace.rate_rps, np.ones(k) / k, mode="same")
    centre = float(trace.rate_t[int(np.argmax(smooth))]) + step / 2
    t0 = min(max(0.0, centre - window_s / 2), max(0.0, trace.duration_s - window_s))
    return t0, min(trace.duration_s, t0 + window_s)


def size_static_for_peak(trace: Trace, profile: InstanceProfile, autoscale: AutoscaleConfig,
                         sim: SimConfig | None = None, target: float = 0.99, window_s: float = 3600.0,
                         max_instances: int = 512, log: Callable[[str], None] | None = None,
                         jobs: int = 1) -> tuple[int, list[tuple[int, float]]]:
    """The smallest static pool meeting ``target`` TTFT attainment over the peak window.

    A bisection (attainment grows with the pool) between the offered load R in
    instances at saturation and R + 3 sqrt(R) (widened if that is not enough);
    returns the size and the (size, attainment) pairs tried. ``jobs`` > 1: each
    round tries ``jobs`` sizes at once in their own processes (the first round both
    ends, then the interval cut in ``jobs + 1`` parts), the same size wherever
    attainment grows with the pool, in about half the rounds on two cores.
    """
    t0, t1 = peak_window(trace, window_s)
    peak = trace.window(t0, t1)
    mean_p = float(np.mean(trace.prompt_tokens)) if len(trace) else 1.0
    mean_o = float(np.mean(trace.output_tokens)) if len(trace) else 1.0
    per_instance = profile.saturation_tokens_per_s(mean_p, mean_o)
    r = len(peak) / max(peak.duration_s, 1e-9) * (mean_p + mean_o) / per_instance
    too_long = int(np.sum(peak.prompt_tokens + peak.output_tokens > profile.kv_capacity_tokens))
    if len(peak) and too_long / len(peak) > 1 - target:  # refused at any size: no pool would pass
        raise ValueError(f"{too_long} of {len(peak)} peak-hour requests exceed the instance's KV capacity "
                         f"({profile.kv_capacity_tokens} tokens) and are refused, so no static pool meets "
                         f"{target:.0%} of them within the TTFT SLO: give --static-instances N")
    tried: dict[int, float] = {}
    base = sim or SimConfig()
    width = max(1, jobs)  # sizes tried a round

    def run(sizes: list[int]) -> None:
        todo = [n for n in dict.fromkeys(sizes) if n not in tried]
        for n, res in zip(todo, run_many(peak, profile, autoscale, base, [("static", n, n) for n in todo], width)):
            tried[n] = res.summary.ttft_attainment
            if log:
                log(f"static {n}: {tried[n]:.2%} of peak-hour requests within the TTFT SLO")

    def ok(n: int) -> bool:
        run([n])
        return tried[n] >= target

    lo = max(1, math.floor(r))  # below saturation a static pool cannot keep up
    hi = min(max_instances, max(lo + 1, math.ceil(r + 3 * math.sqrt(r))))
    run([hi, lo] if width > 1 else [hi])
    while not ok(hi):
        if hi >= max_instances:
            raise ValueError(f"no static pool up to {max_instances} instances meets the TTFT SLO at the peak "
                             "(the trace's peak is beyond what the profile can serve): give --static-instances N")
        lo, hi = hi, min(max_instances, 2 * hi)
    if ok(lo):
        hi = lo
    while hi - lo > 1:  # invariant: lo fails, hi passes; one job: the midpoint
        cuts = sorted({lo + (hi - lo) * (i + 1) // (width + 1) for i in range(width)} - {lo, hi})
        run(cuts)
        passing = [n for n in cuts if tried[n] >= target]
        hi = min(passing, default=hi)
        lo = max((n for n in cuts if n < hi and tried[n] < target), default=lo)
    return hi, sorted(tried.items())


def initial_instances(trace: Trace, static_n: int, min_instances: int) -> int:
    """What a pool sized like ``static_n`` at the peak needs at the trace's first minute."""
    if not len(trace.rate_rps) or trace.peak_rps <= 0:
        return max(min_instances, 1)
    return max(min_instances, math.ceil(static_n * trace.rate_rps[0] / trace.peak_rps))


def run_policies(trace: Trace, profile: InstanceProfile, base: AutoscaleConfig, policies: Sequence[str],
                 static_n: int, sim: SimConfig | None = None, initial: int | None = None,
                 log: Callable[[str], None] | None = None) -> list[SimResult]:
    """One run per policy; ``static`` runs at ``static_n`` instances, the others start at ``initial``."""
    sim = sim or SimConfig()
    start = initial if initial is not None else initial_instances(trace, static_n, base.bounds.min_instances)
    results = []
    for name in policies:
        cfg = base.model_copy(update={"policy": name, "static": StaticConfig(instances=static_n)})
        label = f"static-{static_n}" if name == "static" else name
        n0 = static_n if name == "static" else start
        res = Simulator(trace, profile, cfg, sim.model_copy(update={"initial_instances": n0}), label=label).run()
        if log:
            s = res.summary
            log(f"{label}: {s.ttft_attainment:.2%} within TTFT SLO, {s.instance_hours:.1f} instance-hours "
                f"({s.wall_s:.1f}s)")
        results.append(res)
    return results
