"""A canary rollout replayed in the simulator: the live analysis judges simulated outcomes.

The gateway's own :class:`~llmserve.gateway.canary.CanaryAnalysis` (through its
public ``start``/``record``/``tick``/``events`` only) is fed the simulated requests'
outcomes as the live gateway's recorder would send them (an
:class:`~llmserve.gateway.canary_evidence.Outcome` when a request ends), looks at
every ``interval_s`` from the gateway's start, and moves the canary's weight; the :class:`~llmserve.gateway.version_router.VersionRouter`
splits each request by the weights in force when it arrives.

The weights depend on outcomes and the outcomes on the weights, so the rollout is
found as a fixed point: simulate with a weight schedule, judge, and simulate
again with the schedule the analysis made, until it makes the one it was given.
Each pass is causal (a request's outcome depends only on what arrived before it,
and the router draws in arrival order), so a pass fixes at least one more check
than the last, and a rollout of ``n`` checks settles in at most ``n + 1`` passes
(two where every check passes).

Not modelled: a canary version worse than its stable one (the instance profile
is one for all versions, so errors are only rejections, expiries and reclaims,
and latencies only load); sticky users (the trace has none).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from llmserve.gateway.canary import Action, CanaryAnalysis, CanaryConfig
from llmserve.gateway.version_router import VersionRouter, with_weight
from llmserve.gateway.canary_evidence import Outcome
from llmserve.sim.results import COMPLETED, SimResult
from llmserve.sim.traces import Trace

Schedule = list[tuple[float, dict[str, float]]]  # (from this time, the weights)
Simulate = Callable[[dict[str, Trace]], dict[str, SimResult]]  # shares by version -> results by version


@dataclass(frozen=True, slots=True)
class Rollout:
    """What a replayed rollout did: its weights over time, the analysis' events, each
    version's simulated run, and how many passes the fixed point took."""

    schedule: Schedule
    events: list[dict]
    results: dict[str, SimResult]
    passes: int


def split_by_schedule(trace: Trace, schedule: Schedule, seed: int) -> dict[str, Trace]:
    """Each request to a version by the weights in force at its arrival."""
    router = VersionRouter(schedule[0][1], rng=random.Random(seed))
    picks, k = [], 0
    for t in trace.arrival_s.tolist():
        while k + 1 < len(schedule) and schedule[k + 1][0] <= t:
            k += 1
            router.set_weights(schedule[k][1])
        picks.append(router.route().version)
    chosen = np.array(picks, dtype=object)
    out = {}
    for version in schedule[0][1]:
        keep = chosen == version
        out[version] = Trace(f"{trace.name}/{version}", trace.arrival_s[keep], trace.prompt_tokens[keep],
                             trace.output_tokens[keep], trace.priority[keep], trace.duration_s)
    return out


def _outcomes(version: str, res: SimResult) -> list[tuple[float, str, bool, float | None, float | None]]:
    """(time the gateway records it, version, ok, TTFT, e2e) per request, as the gateway's recorder."""
    out = []
    for arrival, status, ttft, e2e in zip(res.arrival_s.tolist(), res.status.tolist(), res.ttft.tolist(),
                                          res.e2e.tolist()):
        ok = status == COMPLETED
        out.append((arrival + e2e if ok else arrival, version, ok,
                    None if np.isnan(ttft) else ttft, e2e if ok else None))
    return out


def _shortfall(res: SimResult, since: float | None, now: float) -> str | None:
    """The live pool's ``capacity_shortfall`` over a check's interval, from the timeline."""
    t, ready, queued = res.column("t"), res.column("ready"), res.column("queued")
    span = (t <= now) & ((t > since) if since is not None else (t >= 0))
    if np.any(ready[span] == 0):
        return "has no ready instance (starting, warming or scaled to zero)"
    if np.any(queued[span] > 0):
        return f"queued for capacity ({int(queued[span].max())} waiting)"
    return None


def judge(cfg: CanaryConfig, canary: str, stable: str, base: dict[str, float], results: dict[str, SimResult],
          horizon_s: float) -> tuple[Schedule, list[dict]]:
    """Run the live analysis over simulated outcomes: the schedule it makes, its events."""
    analysis = CanaryAnalysis(canary, stable, cfg)
    analysis.start(0.0, "started with the gateway")
    schedule: Schedule = [(0.0, with_weight(base, canary, analysis.weight))]
    outcomes = sorted(o for v in (canary, stable) for o in _outcomes(v, results[v]))
    k, last = 0, None
    for step in range(int(horizon_s // cfg.interval_s) + 1):
        now = step * cfg.interval_s
        while k < len(outcomes) and outcomes[k][0] <= now:
            t, version, ok, ttft, e2e = outcomes[k]
            # A simulated failure is a request the pool could not serve (rejected, expired, reclaimed).
            analysis.record(version, t, Outcome(ttft_s=ttft, e2e_s=e2e) if ok else Outcome(error="unserved"))
            k += 1
        short = _shortfall(results[canary], last, now)
        d = analysis.tick(now, f"not judged: the canary pool {short}" if short else None)
        last = now
        if d.action not in (Action.NONE, Action.SKIP, Action.HOLD, Action.INCONCLUSIVE):
            schedule.append((now, with_weight(base, canary, d.weight)))
    return schedule, analysis.events()


def replay(cfg: CanaryConfig, canary: str, stable: str, base: dict[str, float], trace: Trace, seed: int,
           simulate: Simulate, max_passes: int | None = None) -> Rollout:
    """The rollout's fixed point (see the module's docstring)."""
    schedule: Schedule = [(0.0, with_weight(base, canary, cfg.start_weight))]
    limit = max_passes or int(trace.duration_s // cfg.interval_s) + 2
    for passes in range(1, limit + 1):
        results = simulate(split_by_schedule(trace, schedule, seed))
        made, events = judge(cfg, canary, stable, base, results, trace.duration_s)
        if made == schedule:
            return Rollout(schedule, events, results, passes)
        schedule = made
    raise RuntimeError(f"the rollout did not settle in {limit} passes")
