"""The elastic controller against a fake provider and a real (in-memory) gateway Pool.

No processes and no HTTP: engines are :class:`FakeEngine` records moved by hand,
the clock is fake, and traffic is real ``Pool.acquire``/``release`` calls, so
"no traffic to a warming instance" and "no stop with a request in flight" are
checked on the very pool the gateway routes with.
"""

from __future__ import annotations

import asyncio

import pytest

from llmserve.autoscale.reconcile import plan_scaling
from llmserve.lifecycle import InstanceState as S
from llmserve.priority import PriorityClass
from llmserve.gateway.balancer import RouteRequest
from llmserve.gateway.pool import Outcome

from .fakes import make_controller

REQ = RouteRequest()


async def settle(ctl) -> None:
    """Let the starts and stops the last step launched run to completion."""
    for _ in range(5):
        tasks = list(ctl.launcher.tasks.values())
        if not tasks:
            await asyncio.sleep(0)
            return
        await asyncio.gather(*tasks, return_exceptions=True)


async def step(ctl, clock, dt: float = 1.0) -> None:
    clock.t += dt
    await ctl.step()
    await settle(ctl)


def states(ctl) -> dict[str, str]:
    return {i.id: i.state.value for i in ctl.instances.values()}


def transitions(ctl, instance_id: str) -> list[str]:
    return [e["new"] for e in ctl.history.events() if e["instance_id"] == instance_id and e["kind"] == "transition"]


async def ready_pool(ctl, provider, clock, n_steps: int = 2) -> None:
    for _ in range(n_steps):
        await step(ctl, clock)
        for e in provider.engines.values():
            if e.state in ("starting", "warming"):
                e.state = "ready"
    await step(ctl, clock)


async def test_an_instance_goes_starting_warming_ready_and_joins_the_pool_only_when_ready():
    ctl, provider, pool, clock = make_controller()
    await step(ctl, clock)
    assert states(ctl) == {"v1-1": "starting"}
    assert provider.specs[0].engine_args == ("--threads", "1")
    assert pool.instances() == []
    await step(ctl, clock)  # still loading
    assert states(ctl) == {"v1-1": "starting"}
    provider.engines["v1-1"].state = "warming"
    await step(ctl, clock)
    assert states(ctl) == {"v1-1": "warming"} and pool.instances() == []
    provider.engines["v1-1"].state = "ready"
    await step(ctl, clock)
    assert states(ctl) == {"v1-1": "ready"}
    assert [i.instance_id for i in pool.instances()] == ["v1-1"]
    assert transitions(ctl, "v1-1") == ["starting", "warming", "ready"]
    kinds = [e["kind"] for e in ctl.history.events() if e["instance_id"] == "v1-1"]
    assert kinds.index("pool_add") > kinds.index("transition", 2)  # joined after the ready transition
    assert all(e["reason"] for e in ctl.history.events())


async def test_an_engine_ready_between_two_probes_still_passes_through_warming():
    ctl, provider, pool, clock = make_controller(initial_state="ready")
    await step(ctl, clock)
    await step(ctl, clock)
    assert transitions(ctl, "v1-1") == ["starting", "warming", "ready"]


async def test_requests_wait_for_a_ready_instance_and_never_go_to_a_warming_one():
    ctl, provider, pool, clock = make_controller(policy="static", static=2, min_instances=1)
    await step(ctl, clock)
    provider.engines["v1-1"].state = "ready"
    provider.engines["v1-2"].state = "warming"
    await step(ctl, clock)
    assert states(ctl) == {"v1-1": "ready", "v1-2": "warming"}
    leases = [await asyncio.wait_for(pool.acquire(REQ, PriorityClass.REALTIME), 1) for _ in range(4)]
    assert {lease.instance.instance_id for lease in leases} == {"v1-1"}
    waiting = asyncio.create_task(pool.acquire(REQ, PriorityClass.REALTIME))  # v1-1 is full (4 slots)
    await asyncio.sleep(0.01)
    assert not waiting.done()
    provider.engines["v1-2"].state = "ready"
    await step(ctl, clock)
    lease = await asyncio.wait_for(waiting, 1)
    assert lease.instance.instance_id == "v1-2"
    for x in leases + [lease]:
        pool.release(x, Outcome.SUCCESS)


async def test_scale_down_drains_first_and_stops_only_when_nothing_is_in_flight():
    ctl, provider, pool, clock = make_controller(policy="static", static=2)
    await ready_pool(ctl, provider, clock)
    assert states(ctl) == {"v1-1": "ready", "v1-2": "ready"}
    a = await pool.acquire(REQ, PriorityClass.REALTIME)
    b = await pool.acquire(REQ, PriorityClass.REALTIME)
    busy = {a.instance.instance_id: a, b.instance.instance_id: b}
    assert set(busy) == {"v1-1", "v1-2"}  # least-loaded picking spreads them
    for iid in busy:
        provider.engines[iid].running = 1
    ctl.set_override(1, None, "test scale-down")
    await step(ctl, clock)
    draining = [iid for iid, s in states(ctl).items() if s == "draining"]
    assert len(draining) == 1
    victim = draining[0]
    assert not pool.get(victim).accepting
    # New requests avoid the draining instance.
    c = await pool.acquire(REQ, PriorityClass.REALTIME)
    assert c.instance.instance_id != victim
    pool.release(c, Outcome.SUCCESS)
    for _ in range(3):
        await step(ctl, clock)
    assert states(ctl)[victim] == "draining" and victim not in provider.stops
    pool.release(busy[victim], Outcome.SUCCESS)  # the gateway's request ends ...
    await step(ctl, clock)
    assert victim not in provider.stops  # ... but the engine still reports it running
    provider.engines[victim].running = 0
    await step(ctl, clock)
    assert victim not in ctl.instances and provider.stops == [victim]
    assert provider.engines[victim].sigterm_with_running == 0
    assert pool.get(victim) is None
    assert transitions(ctl, victim)[-3:] == ["draining", "stopping", "stopped"]
    stop = next(e for e in ctl.history.events() if e["new"] == "stopping" and e["instance_id"] == victim)
    assert stop["old"] == "draining" and stop["details"]["in_flight"] == 0
    kinds = [(e["kind"], e["new"]) for e in ctl.history.events() if e["instance_id"] == victim]
    # out of the balancer before the stop
    assert kinds.index(("pool_remove", "draining")) < kinds.index(("transition", "stopping"))
    pool.release(busy[[i for i in busy if i != victim][0]], Outcome.SUCCESS)


async def test_a_drain_that_never_ends_is_cut_at_the_drain_timeout():
    ctl, provider, pool, clock = make_controller(policy="static", static=2, drain_timeout_s=10.0)
    await ready_pool(ctl, provider, clock)
    leases = [await pool.acquire(REQ, PriorityClass.REALTIME) for _ in range(2)]
    ctl.set_override(1, None, "test")
    await step(ctl, clock)
    victim = next(iid for iid, s in states(ctl).items() if s == "draining")
    await step(ctl, clock, 5.0)
    assert victim not in provider.stops
    await step(ctl, clock, 6.0)
    assert provider.stops == [victim]
    stop = next(e for e in ctl.history.events() if e["new"] == "stopping")
    assert "drain timeout" in stop["reason"] and stop["details"]["in_flight"] == 1
    for x in leases:
        pool.release(x, Outcome.NEUTRAL)


async def test_a_failed_ready_instance_leaves_the_pool_and_is_replaced_at_once():
    ctl, provider, pool, clock = make_controller(policy="static", static=2)
    await ready_pool(ctl, provider, clock)
    provider.engines["v1-1"].exit_code = -9
    await step(ctl, clock, 0.1)  # a probe round, before the next policy tick
    assert "v1-1" not in ctl.instances and pool.get("v1-1") is None
    assert ctl.book.finished[-1].state is S.FAILED and "code -9" in ctl.book.finished[-1].reason
    assert states(ctl) == {"v1-2": "ready", "v1-3": "starting"}
    assert ctl.instances["v1-3"].replaces == "v1-1"
    provider.engines["v1-3"].state = "ready"
    await step(ctl, clock)
    assert states(ctl) == {"v1-2": "ready", "v1-3": "ready"}
    assert len(provider.engines) == 3  # replaced once, nothing else started


async def test_a_ready_instance_whose_engine_died_under_a_live_process_is_replaced():
    ctl, provider, pool, clock = make_controller(policy="static", static=2, ready_probe_interval_s=2.0)
    await ready_pool(ctl, provider, clock)
    dead = provider.engines["v1-1"]
    dead.state = "failed"  # its /ready says failed; the process runs on and the gateway still routes to it
    waited = 0.0
    while "v1-1" in ctl.instances and waited < 10:
        assert dead.exit_code is None and pool.get("v1-1").ready
        await step(ctl, clock, 0.5)
        waited += 0.5
    assert waited <= 2.0  # within one ready probe interval, no grace period
    assert pool.get("v1-1") is None
    failed = ctl.book.finished[-1]
    assert failed.state is S.FAILED and "engine died while ready: boom" in failed.reason
    assert "v1-1" in provider.stops  # the live process is stopped, not left behind
    assert states(ctl) == {"v1-2": "ready", "v1-3": "starting"} and ctl.instances["v1-3"].replaces == "v1-1"
    provider.engines["v1-3"].state = "ready"
    await step(ctl, clock)
    assert states(ctl) == {"v1-2": "ready", "v1-3": "ready"} and pool.get("v1-3").ready


async def test_a_vanished_actor_and_an_unreachable_instance_are_failed_and_replaced():
    ctl, provider, pool, clock = make_controller(policy="static", static=2, unready_grace_s=5.0)
    await ready_pool(ctl, provider, clock)
    provider.engines["v1-1"].vanished = True
    pool.get("v1-2").ready = False  # what the gateway's monitor does when /ready stops answering
    await step(ctl, clock)
    assert "v1-1" not in ctl.instances and "v1-2" in ctl.instances
    waited = 0.0
    while "v1-2" in ctl.instances and waited < 10:
        pool.get("v1-2").ready = False
        await step(ctl, clock, 1.5)
        waited += 1.5
    assert "v1-2" not in ctl.instances and waited > 5.0
    reasons = {i.id: i.reason for i in ctl.book.finished}
    assert "actor died" in reasons["v1-1"] and "not answering /ready" in reasons["v1-2"]
    assert sorted(i.replaces for i in ctl.instances.values()) == ["v1-1", "v1-2"]
    assert "v1-2" in provider.stops  # the unreachable process was released too


async def test_instances_that_fail_to_start_are_retried_with_a_growing_backoff():
    ctl, provider, pool, clock = make_controller(restart_backoff_s=4.0)
    await step(ctl, clock)
    provider.engines["v1-1"].state = "failed"
    await step(ctl, clock)
    assert ctl.book.finished[-1].id == "v1-1" and "engine failed to start: boom" in ctl.book.finished[-1].reason
    assert ctl.instances == {}  # the replacement waits out the backoff (4 s)
    await step(ctl, clock, 2.0)
    assert ctl.instances == {}
    await step(ctl, clock, 2.5)
    assert list(ctl.instances) == ["v1-2"]
    provider.engines["v1-2"].state = "failed"
    await step(ctl, clock)
    await step(ctl, clock, 5.0)
    assert ctl.instances == {}  # second failure: 8 s
    await step(ctl, clock, 4.0)
    assert list(ctl.instances) == ["v1-3"]
    provider.engines["v1-3"].state = "ready"
    await step(ctl, clock)
    assert ctl.executor.start_not_before == 0.0  # a ready instance resets the backoff


async def test_a_provider_that_cannot_start_fails_the_instance():
    ctl, provider, pool, clock = make_controller()
    provider.fail_start = True
    await step(ctl, clock)
    assert ctl.instances == {} and "start failed: RuntimeError: no capacity" in ctl.book.finished[-1].reason


async def test_a_start_that_never_gets_ready_times_out():
    ctl, provider, pool, clock = make_controller(start_timeout_s=30.0)
    await step(ctl, clock)
    await step(ctl, clock, 31.0)
    assert ctl.book.finished[-1].state is S.FAILED and "start timeout" in ctl.book.finished[-1].reason
    assert ctl.book.finished[-1].id in provider.stops


async def test_scale_down_cancels_starting_instances_which_never_join_the_pool():
    ctl, provider, pool, clock = make_controller(max_instances=4)
    await ready_pool(ctl, provider, clock)
    ctl.set_override(3, None, "burst")
    await step(ctl, clock)
    assert sorted(states(ctl).values()) == ["ready", "starting", "starting"]
    ctl.set_override(1, None, "burst over")
    await step(ctl, clock)
    assert states(ctl) == {"v1-1": "ready"}
    assert sorted(provider.stops) == ["v1-2", "v1-3"]
    assert [i.instance_id for i in pool.instances()] == ["v1-1"]
    assert transitions(ctl, "v1-3") == ["starting", "stopping", "stopped"]


async def test_scale_up_revives_a_draining_instance_before_starting_a_new_one():
    ctl, provider, pool, clock = make_controller(policy="static", static=2)
    await ready_pool(ctl, provider, clock)
    lease = await pool.acquire(REQ, PriorityClass.REALTIME)
    busy = lease.instance.instance_id
    provider.engines[busy].running = 1
    ctl.set_override(0, None, "maintenance")
    await step(ctl, clock)
    assert set(states(ctl).values()) == {"draining"} or busy in states(ctl)
    assert states(ctl)[busy] == "draining"
    ctl.set_override(1, None, "back")
    await step(ctl, clock)
    assert states(ctl)[busy] == "ready" and pool.get(busy).accepting
    assert len(provider.engines) == 2  # nothing new started
    assert transitions(ctl, busy)[-2:] == ["draining", "ready"]
    pool.release(lease, Outcome.SUCCESS)


async def test_overrides_expire_and_bad_ones_are_refused():
    ctl, provider, pool, clock = make_controller(max_instances=3)
    await ready_pool(ctl, provider, clock)
    with pytest.raises(ValueError):
        ctl.set_override(4, None, "too many")
    ctl.set_override(2, 5.0, "for a while")
    await step(ctl, clock)
    assert ctl.provisioned() == 2
    decision = ctl.history.decisions(limit=1)[0]
    assert decision["source"] == "manual" and decision["policy_desired"] == 1
    assert "manual override to 2 (for a while)" in decision["reason"]
    for _ in range(3):
        await step(ctl, clock, 2.0)
        for e in provider.engines.values():
            e.state = "ready" if e.exit_code is None else e.state
    assert not ctl.override_active()
    assert ctl.history.decisions(limit=1)[0]["source"] == "policy"
    assert any(e["kind"] == "override" and e["new"] == "expired" for e in ctl.history.events())


async def test_signals_come_from_the_observers_of_this_pool_only():
    ctl, provider, pool, clock = make_controller()
    await ready_pool(ctl, provider, clock)
    await step(ctl, clock, ctl.config.signal_window_s)  # the rate window is full from here on
    for k in range(20):
        ctl.on_arrival("m", "v1", clock.t, 400)
        ctl.on_arrival("other", "v1", clock.t, 400)
        ctl.on_first_token("m", "v1", clock.t, 0.25)
        ctl.on_finish("m", "v1", clock.t, 1.5, 32, True)
        ctl.on_finish("m", "v1", clock.t, 99.0, 32, False)  # failures are not latency samples
    await step(ctl, clock, 1.0)
    sig = ctl.last_signals
    assert sig.arrival_rate == pytest.approx(20 / ctl.config.signal_window_s)
    assert sig.ttft_p99 == 0.25 and sig.e2e_p99 == 1.5
    assert sig.ready == 1 and sig.provisioned == 1
    sample = ctl.history.samples(limit=1)[0]
    assert sample["arrival_rate"] == sig.arrival_rate and sample["ready"] == 1


async def test_stop_drains_and_stops_everything_and_closes_the_provider():
    ctl, provider, pool, clock = make_controller(policy="static", static=2)
    await ready_pool(ctl, provider, clock)
    await ctl.stop()
    assert ctl.instances == {} and sorted(provider.stops) == ["v1-1", "v1-2"]
    assert provider.closed and pool.instances() == []
    assert all(transitions(ctl, i)[-3:] == ["draining", "stopping", "stopped"] for i in ("v1-1", "v1-2"))


def test_history_returns_the_newest_entries_after_a_sequence_number():
    from llmserve.autoscale.history import History

    h = History(max_events=5)
    for k in range(8):
        h.event(float(k), f"i{k}", "transition", None, "starting", f"r{k}")
    assert [e["instance_id"] for e in h.events()] == ["i3", "i4", "i5", "i6", "i7"]  # bounded
    assert [e["seq"] for e in h.events(since=6)] == [7, 8]
    assert [e["seq"] for e in h.events(limit=2)] == [7, 8]
    assert [e["seq"] for e in h.events(since=8)] == []


async def test_the_pools_in_flight_count_is_the_gateways_own_when_reports_lag():
    """KPA and the backlog floor read in_flight: it must hold every request the gateway
    has sent out or queued, whatever the (poll-old) load reports say."""
    ctl, provider, pool, clock = make_controller()
    await ready_pool(ctl, provider, clock)
    leases = [await asyncio.wait_for(pool.acquire(REQ, PriorityClass.REALTIME), 1) for _ in range(4)]
    queued = [asyncio.create_task(pool.acquire(REQ, PriorityClass.REALTIME)) for _ in range(3)]
    await asyncio.sleep(0)
    ctx = ctl.signals(clock.t)
    seen = pool.stats()
    assert (seen.inflight, sum(seen.queue_depth.values())) == (4, 3)
    assert ctx.running + ctx.waiting < 4  # the fake engines report nothing running
    assert ctx.in_flight == 7
    for t in queued:
        t.cancel()
    for lease in leases:
        pool.release(lease, Outcome.SUCCESS)


async def test_an_instance_whose_stop_is_under_way_is_stopping_billed_and_no_longer_capacity():
    ctl, provider, pool, clock = make_controller(policy="static", static=2)
    await ready_pool(ctl, provider, clock)
    exited = asyncio.Event()
    stop = provider.stop

    async def slow_stop(handle, grace_s):
        await exited.wait()  # the engine takes its time to exit
        return await stop(handle, grace_s)

    provider.stop = slow_stop
    ctl.set_override(1, None, "scale down")
    await ctl.step()  # drain starts (nothing in flight) ...
    clock.t += 1.0
    await ctl.step()  # ... and ends: the stop is sent, the process has not exited
    victim = next(iid for iid, s in states(ctl).items() if s != "ready")
    assert states(ctl)[victim] == "stopping" and pool.get(victim) is None
    assert ctl.provisioned() == 1 and ctl.describe()["counts"]["stopping"] == 1
    assert ctl.counts()[S.STOPPING] == 1 and ctl.counts()[S.DRAINING] == 0
    assert ctl.signals(clock.t).draining == 1  # on its way out, for the policy as before
    ctl.apply(plan_scaling(2, ctl.statuses()), "load is back", clock.t)  # a stopping instance is not revived
    assert states(ctl)[victim] == "stopping"
    provider.engines[victim].state = "failed"  # what its probe says on the way out is not judged
    clock.t += 1.0
    await ctl.step()
    assert states(ctl)[victim] == "stopping"
    exited.set()
    await settle(ctl)
    assert victim not in ctl.instances and ctl.book.finished[-1].state is S.STOPPED
    assert transitions(ctl, victim)[-3:] == ["draining", "stopping", "stopped"]


async def test_a_stopped_instance_keeps_its_served_count():
    ctl, provider, pool, clock = make_controller(policy="static", static=2)
    await ready_pool(ctl, provider, clock)
    for _ in range(2):
        leases = [await pool.acquire(REQ, PriorityClass.REALTIME) for _ in range(2)]
        for x in leases:
            pool.release(x, Outcome.SUCCESS)
    ctl.set_override(1, None, "down")
    for _ in range(3):
        await step(ctl, clock)
    [gone] = [i for i in ctl.instance_views() if i["state"] == "stopped"]
    assert gone["served"] == 2
    stop = next(e for e in ctl.history.events() if e["new"] == "stopping")
    assert stop["details"]["served"] == 2
