"""The live controller and the simulator make the same scaling decisions on one trace.

One synthetic trace (a rise, a peak, a fall) goes through the live
:class:`~llmserve.autoscale.controller.PoolController` (a real in-memory gateway
``Pool``, a fake provider whose instances are ready a fixed time after their start,
a fake clock stepped a second at a time) and through the :class:`Simulator` with the
same cold start, policy, gateway and defaults. Both must change the instance count
at the same ticks, from the same counts to the same counts.

The requests outlive the compared span (long outputs; the live side never ends
them), so what the policy sees is arrivals, prompt-token estimates, the
output-token prior, queues, in-flight counts and the lifecycle: exactly what the
two sides must compute alike. A different default on one side (the prior, the
characters per token) or the simulator counting prompt tokens exactly instead of
estimating them as the gateway does moves the predictive policy's demand, and
with it the decisions.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Hashable

import numpy as np

from llmserve.autoscale.config import AutoscaleConfig, BoundsConfig, PredictiveConfig
from llmserve.autoscale.controller import ControllerConfig, PoolController
from llmserve.autoscale.effects import Advance, Effect, Start, Stop
from llmserve.autoscale.providers.base import InstanceSpec
from llmserve.gateway.admission import ConcurrencyConfig
from llmserve.gateway.balancer import RouteRequest
from llmserve.gateway.pool import Pool
from llmserve.priority import PriorityClass
from llmserve.sim.profile import InstanceProfile, StepModel
from llmserve.sim.simulator import SimConfig, Simulator
from llmserve.sim.traces import Trace

from tests.autoscale.fakes import Clock, FakeProber, FakeProvider

COLD_S, WARMUP_S = 20.0, 4.0
SPAN_S = 300.0  # decisions compared up to here; no request finishes before it
PROMPT_CHARS_PER_TOKEN = 3.0  # not the controller's 4: the estimate's error must be the same on both sides
CONCURRENCY = ConcurrencyConfig(fixed=64)


def autoscale() -> AutoscaleConfig:
    return AutoscaleConfig(
        policy="predictive", tick_s=2.0,
        predictive=PredictiveConfig(capacity_tokens_per_s=400.0, lead_time_s=30.0),
        bounds=BoundsConfig(min_instances=1, max_instances=16, scale_up_cooldown_s=6.0, scale_down_window_s=20.0))


def trace() -> Trace:
    rng = np.random.default_rng(7)
    times, t = [], 30.0
    for end, rps in ((90.0, 0.5), (150.0, 2.0), (200.0, 4.0), (260.0, 0.3)):
        while True:
            t += rng.exponential(1 / rps)
            if t >= end:
                t = end
                break
            times.append(t)
    n = len(times)
    return Trace("same-decisions", np.array(times), rng.integers(400, 1600, n), np.full(n, 20_000),
                 np.zeros(n, np.int8), SPAN_S)


def profile() -> InstanceProfile:
    # A step of 50 ms: a 20,000-token output takes 1,000 s, well past the compared span.
    return InstanceProfile("slow", StepModel(0.05, 0.0, 0.0, 0.0), max_num_seqs=256, max_num_batched_tokens=4096,
                           kv_capacity_tokens=10**9, cold_start_s=COLD_S, warmup_s=WARMUP_S)


PROBE_S = 1.0  # the live loop's step: it sees a start's progress or a drain's end this much later at most


def observed(e: Effect) -> bool:
    """Made from what an instance was seen to do, not decided: a start's progress, a drain's end."""
    return isinstance(e, Advance) or (isinstance(e, Stop) and e.reason.startswith("drained"))


def effects(log: list[tuple[float, Effect]], ids: Callable[[Hashable], int]) -> list[tuple]:
    """What the executor was told to do up to the compared span: time, effect, instance
    (target, capacity class). Not the reasons: they quote signals that do not move the
    decision (the live side sees no latencies here, its requests never start)."""
    out = []
    for t, e in log:
        if t > SPAN_S:
            continue
        iid = None if isinstance(e, Start) else ids(e.id)
        what = e.to.value if isinstance(e, Advance) else e.capacity_class if isinstance(e, Start) else None
        out.append((t, type(e).__name__, iid, what, observed(e)))
    return out


def assert_same_effects(live: list[tuple], sim: list[tuple]) -> None:
    assert [e[1:] for e in live] == [e[1:] for e in sim]  # the same effects, instances, order
    for (t_live, *_, seen), (t_sim, *_) in zip(live, sim):
        assert t_sim <= t_live <= t_sim + PROBE_S if seen else t_live == t_sim


def simulated(tr: Trace) -> tuple[list[tuple[float, int, int]], list[tuple]]:
    cfg = SimConfig(initial_instances=0, prompt_chars_per_token=PROMPT_CHARS_PER_TOKEN)
    sim = Simulator(tr, profile(), autoscale(), cfg, concurrency=CONCURRENCY)
    sim.executor.log = []
    res = sim.run()
    decisions = [(t, before, after) for t, before, after, _ in res.events if t <= SPAN_S]
    return decisions, effects(sim.executor.log, int)


def age_engines(ctl: PoolController, provider: FakeProvider, now: float) -> None:
    """The fake engines load, warm up and are ready on the simulated instance's schedule."""
    for inst in ctl.instances.values():
        engine = provider.engines.get(inst.id)
        if engine is None or engine.state == "ready":
            continue
        age = now - inst.created
        engine.state = "ready" if age >= COLD_S else "warming" if age >= COLD_S - WARMUP_S else provider.initial_state


async def live(tr: Trace) -> tuple[list[tuple[float, int, int]], list[tuple]]:
    clock = Clock(0.0)
    provider = FakeProvider()
    pool = Pool("m/v1", concurrency=CONCURRENCY, clock=clock, rng=random.Random(0))
    cfg = ControllerConfig(drain_timeout_s=1e6)  # defaults otherwise: the point of the test
    ctl = PoolController(pool, "m", "v1", autoscale(), provider, lambda iid: InstanceSpec(iid, ()), cfg,
                         prober=FakeProber(provider), clock=clock, wall=clock)
    ctl.executor.log = []
    leases, k, n = [], 0, len(tr)
    for t in range(2, int(SPAN_S) + 1):  # the first step is the first tick, as the simulator's
        clock.t = float(t)
        while k < n and tr.arrival_s[k] <= t:  # arrivals never fall on a whole second
            ctl.on_arrival("m", "v1", float(tr.arrival_s[k]), round(tr.prompt_tokens[k] * PROMPT_CHARS_PER_TOKEN))
            leases.append(pool.enqueue(RouteRequest(), PriorityClass.REALTIME))
            k += 1
        age_engines(ctl, provider, clock.t)
        await ctl.step()
        for _ in range(5):  # the starts and stops the step launched
            tasks = list(ctl.launcher.tasks.values())
            if not tasks:
                break
            await asyncio.gather(*tasks, return_exceptions=True)
    done = effects(ctl.executor.log, lambda iid: int(iid.removeprefix("v1-")) - 1)  # "v1-1" is the sim's 0
    await ctl.stop()
    return [(d["time"], d["provisioned"], d["desired"]) for d in ctl.history.decisions(changes_only=True)], done


async def test_the_live_controller_and_the_simulator_decide_alike_and_act_alike():
    tr = trace()
    sim, sim_effects = simulated(tr)
    assert len({after for _, _, after in sim}) >= 4 and any(a < b for _, b, a in sim)  # up and down
    kinds = {kind for _, kind, *_ in sim_effects}
    assert {"Start", "Drain"} <= kinds and ({"Stop", "Undrain"} & kinds)  # more than starts
    decisions, live_effects = await live(tr)
    assert decisions == sim
    assert_same_effects(live_effects, sim_effects)
