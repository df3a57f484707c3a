"""A canary rollout, live and simulated: the same canary steps and the same effects in the same order.

Two versions of one model, each its own pool: ``v1`` stable, ``v2`` the canary,
which starts with the gateway at a quarter of the traffic. The live side is what
``llmserve serve`` runs (one :class:`PoolController` per version over a real
gateway ``Pool``, a fake provider, the gateway's :class:`VersionRouter`, the live
:class:`CanaryAnalysis` ticked by the gateway runtime's own ``tick``), on a fake
clock stepped a second at a time; its fake requests end a fixed time after they
get a slot, and each end is recorded as the gateway's recorder would. The
simulated side is :func:`llmserve.sim.canary_replay.replay` over two
:class:`Simulator` pools.

Both must make the same rollout (start, advance, promote at the same looks) and,
per pool, the same effects in the same order. The weights move which requests
each pool sees, so a look that went another way on one side would change both
pools' later effects.
"""

from __future__ import annotations

import asyncio
import random

import numpy as np

from llmserve.autoscale.config import AutoscaleConfig, BoundsConfig, PredictiveConfig
from llmserve.autoscale.controller import ControllerConfig, PoolController
from llmserve.autoscale.providers.base import InstanceSpec
from llmserve.gateway.balancer import RouteRequest
from llmserve.gateway.canary import CanaryAnalysis, CanaryConfig
from llmserve.gateway.canary_evidence import Outcome
from llmserve.gateway.metrics import GatewayMetrics
from llmserve.gateway.pool import Outcome as Attempt
from llmserve.gateway.pool import Pool
from llmserve.gateway.runtime import ModelRuntime
from llmserve.gateway.version_router import VersionRouter, with_weight
from llmserve.priority import PriorityClass
from llmserve.sim.canary_replay import replay
from llmserve.sim.profile import InstanceProfile, StepModel
from llmserve.sim.simulator import SimConfig, Simulator
from llmserve.sim.traces import Trace

from tests.autoscale.fakes import Clock, FakeProber, FakeProvider
from tests.sim.test_same_decisions import CONCURRENCY, PROBE_S, PROMPT_CHARS_PER_TOKEN, effects

COLD_S, WARMUP_S = 20.0, 4.0
SPAN_S = 300.0
COMPARED_S = SPAN_S - 4  # effects compared up to here: a drain's end just past the span is on one side only
OUTPUT_TOKENS, STEP_S = 20, 0.05  # a request takes about a second once it has a slot
SEED = 3
BASE = {"v1": 1.0, "v2": 0.0}
# Latency and length checks off, wide error margins: every request succeeds on both
# sides, so how many outcomes each look has is what moves the canary.
CANARY = CanaryConfig(start_weight=0.25, step_weight=0.25, max_weight=0.5, interval_s=30.0, min_requests=5,
                      max_ttft_ratio=None, max_tpot_ratio=None, max_e2e_ratio=None, min_output_ratio=None,
                      max_error_rate_delta=0.3, max_refusal_rate_delta=0.3)
GUARD_S = 4.0  # no arrival this close before a look: its outcome falls in the same interval on both sides


def autoscale() -> AutoscaleConfig:
    return AutoscaleConfig(
        policy="predictive", tick_s=2.0,
        predictive=PredictiveConfig(capacity_tokens_per_s=400.0, lead_time_s=30.0),
        bounds=BoundsConfig(min_instances=1, max_instances=8, scale_up_cooldown_s=6.0, scale_down_window_s=20.0))


def trace() -> Trace:
    rng = np.random.default_rng(11)
    times, t = [], 1.0
    for end, rps in ((120.0, 1.5), (200.0, 5.0), (SPAN_S - 10, 0.5)):
        while True:
            t += rng.exponential(1 / rps)
            if t >= end:
                t = end
                break
            if (t + GUARD_S) % CANARY.interval_s > GUARD_S:
                times.append(t)
    n = len(times)
    return Trace("same-rollout", np.array(times), rng.integers(400, 1600, n), np.full(n, OUTPUT_TOKENS),
                 np.zeros(n, np.int8), SPAN_S)


def profile() -> InstanceProfile:
    return InstanceProfile("steady", StepModel(STEP_S, 0.0, 0.0, 0.0), max_num_seqs=256, max_num_batched_tokens=4096,
                           kv_capacity_tokens=10**9, cold_start_s=COLD_S, warmup_s=WARMUP_S)


def simulated(tr: Trace):
    logs: dict[str, list] = {}

    def simulate(shares: dict[str, Trace]):
        out = {}
        for version, share in shares.items():
            sim = Simulator(share, profile(), autoscale(),
                            SimConfig(initial_instances=0, prompt_chars_per_token=PROMPT_CHARS_PER_TOKEN),
                            concurrency=CONCURRENCY, label=f"m/{version}")
            sim.executor.log = []
            out[version] = sim.run()
            logs[version] = effects(sim.executor.log, int)  # (the last pass: the fixed point's)
        return out

    rollout = replay(CANARY, "v2", "v1", BASE, tr, SEED, simulate)
    return rollout.events, logs


class LiveGateway:
    """What the gateway runtime's ``tick`` reads of itself: the analysis, the pools, the router."""

    tick = ModelRuntime.tick

    def __init__(self, pools: dict[str, Pool]) -> None:
        self.canary = CanaryAnalysis("v2", "v1", CANARY)
        self.canary.start(0.0, "started with the gateway")
        self.pools = pools
        self.pool_of = pools  # every version has a pool of its own here
        self._not_judged: str | None = None
        self.config = type("Named", (), {"name": "m"})()
        self.name = "m"
        self.sinks = type("Sinks", (), {"metrics": GatewayMetrics(lambda: [])})()  # (its decisions are counted)
        self.router = VersionRouter(with_weight(BASE, "v2", self.canary.weight), rng=random.Random(SEED))

    def apply_weights(self) -> None:
        self.router.set_weights(with_weight(BASE, "v2", self.canary.weight))


def age_engines(ctl: PoolController, provider: FakeProvider, now: float) -> None:
    for inst in ctl.instances.values():
        engine = provider.engines.get(inst.id)
        if engine is not None and engine.state != "ready":
            age = now - inst.created
            engine.state = "ready" if age >= COLD_S else "warming" if age >= COLD_S - WARMUP_S else \
                provider.initial_state


async def live(tr: Trace):
    clock = Clock(0.0)
    pools, ctls, providers = {}, {}, {}
    for v in BASE:
        providers[v] = FakeProvider()
        pools[v] = Pool(f"m/{v}", concurrency=CONCURRENCY, clock=clock, rng=random.Random(0))
        ctls[v] = PoolController(pools[v], "m", v, autoscale(), providers[v], lambda iid: InstanceSpec(iid, ()),
                                 ControllerConfig(drain_timeout_s=1e6), prober=FakeProber(providers[v]),
                                 clock=clock, wall=clock)
        ctls[v].executor.log = []
    gw = LiveGateway(pools)
    waiting: list[tuple[str, float, object]] = []  # (version, arrival, the pool's waiter)
    running: list[tuple[float, str, float, object]] = []  # (ends at, version, arrival, lease)
    k, n = 0, len(tr)
    for t in range(2, int(SPAN_S) + 1):
        clock.t = float(t)
        for end, v, arrival, lease in [r for r in running if r[0] <= t]:  # the fake requests that ended
            running.remove((end, v, arrival, lease))
            pools[v].release(lease, Attempt.SUCCESS)
            ctls[v].on_finish("m", v, clock.t, clock.t - arrival, OUTPUT_TOKENS, True)  # the gateway's reports
            gw.canary.record(v, clock.t, Outcome(ttft_s=STEP_S, e2e_s=clock.t - arrival))
        while k < n and tr.arrival_s[k] <= t:
            v = gw.router.route().version
            ctls[v].on_arrival("m", v, float(tr.arrival_s[k]), round(tr.prompt_tokens[k] * PROMPT_CHARS_PER_TOKEN))
            waiting.append((v, float(tr.arrival_s[k]), pools[v].enqueue(RouteRequest(), PriorityClass.REALTIME)))
            k += 1
        for v in BASE:
            age_engines(ctls[v], providers[v], clock.t)
            await ctls[v].step()
            for _ in range(5):
                tasks = list(ctls[v].launcher.tasks.values())
                if not tasks:
                    break
                await asyncio.gather(*tasks, return_exceptions=True)
        for item in [w for w in waiting if w[2].done]:  # a slot now: it ends a second of steps later
            waiting.remove(item)
            v, arrival, w = item
            running.append((clock.t + OUTPUT_TOKENS * STEP_S, v, arrival, w.result()))
            ctls[v].on_first_token("m", v, clock.t, clock.t + STEP_S - arrival)
        gw.tick(clock.t)
    logs = {v: effects(ctls[v].executor.log, lambda iid: int(iid.removeprefix(f"{v}-")) - 1) for v in BASE}
    for c in ctls.values():
        await c.stop()
    return gw.canary.events(), logs


def steps(events: list[dict]) -> list[tuple]:
    return [(e["timestamp"], e["action"], e["weight"]) for e in events if e["action"] != "inconclusive"]


def assert_same_effects(live_log: list[tuple], sim_log: list[tuple]) -> None:
    live_log, sim_log = ([e for e in log if e[0] <= COMPARED_S] for log in (live_log, sim_log))
    assert [e[1:] for e in live_log] == [e[1:] for e in sim_log]
    for (t_live, *_, seen), (t_sim, *_) in zip(live_log, sim_log):
        # An observed end of a drain waits for the fake requests' whole-second ends.
        assert t_sim <= t_live <= t_sim + 2 * PROBE_S if seen else t_live == t_sim


async def test_a_canary_rollout_takes_the_same_steps_and_effects_live_and_simulated():
    tr = trace()
    sim_events, sim_logs = simulated(tr)
    actions = [a for _, a, _ in steps(sim_events)]
    assert actions[0] == "start" and "advance" in actions and actions[-1] == "promote"  # a whole rollout
    assert all({"Start", "Drain"} <= {kind for _, kind, *_ in log} for log in sim_logs.values())
    live_events, live_logs = await live(tr)
    assert steps(live_events) == steps(sim_events)
    for v in BASE:
        assert_same_effects(live_logs[v], sim_logs[v])
