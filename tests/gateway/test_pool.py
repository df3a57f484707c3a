"""The pool's request path and run-time interface, without HTTP."""

import asyncio
import math
import time

import pytest

from llmserve.gateway.admission import AdmissionConfig, ClassLimits, ConcurrencyConfig
from llmserve.gateway.balancer import RouteRequest
from llmserve.gateway.circuit import BreakerConfig
from llmserve.gateway.pool import NoHealthyInstance, Outcome, Pool, QueueTimeout
from llmserve.priority import PriorityClass

REQ = RouteRequest()


def _pool(target=1, rt_deadline=5.0, **kw) -> Pool:
    return Pool("m/v1", concurrency=ConcurrencyConfig(fixed=target),
                admission=AdmissionConfig(
                    realtime=ClassLimits(max_queue=10, deadline_s=rt_deadline),
                    batch=ClassLimits(max_queue=10, deadline_s=5.0), batch_min_share=0.0),
                breaker=BreakerConfig(failure_threshold=1, cooloff_s=60), **kw)


async def test_acquire_reserves_a_slot_and_release_frees_it():
    p = _pool(target=2)
    inst = p.add_instance("http://127.0.0.1:9001", ready=True)
    a = await p.acquire(REQ, PriorityClass.REALTIME)
    b = await p.acquire(REQ, PriorityClass.REALTIME)
    assert a.instance is inst and inst.inflight == 2
    waiting = asyncio.create_task(p.acquire(REQ, PriorityClass.REALTIME))
    await asyncio.sleep(0.01)
    assert not waiting.done() and p.stats().queue_depth["realtime"] == 1
    p.release(a, Outcome.SUCCESS)
    c = await asyncio.wait_for(waiting, 1)
    assert c.instance is inst and inst.inflight == 2
    p.release(b, Outcome.SUCCESS)
    p.release(b, Outcome.SUCCESS)  # idempotent
    assert inst.inflight == 1


async def test_waiting_realtime_goes_before_waiting_batch():
    p = _pool()
    p.add_instance("http://127.0.0.1:9001", ready=True)
    hold = await p.acquire(REQ, PriorityClass.REALTIME)
    order = []

    async def one(name, prio):
        lease = await p.acquire(REQ, prio)
        order.append(name)
        await asyncio.sleep(0)
        p.release(lease, Outcome.SUCCESS)

    tasks = [asyncio.create_task(one("batch", PriorityClass.BATCH))]
    await asyncio.sleep(0.01)
    tasks.append(asyncio.create_task(one("realtime", PriorityClass.REALTIME)))
    await asyncio.sleep(0.01)
    p.release(hold, Outcome.SUCCESS)
    await asyncio.gather(*tasks)
    assert order == ["realtime", "batch"]


async def test_a_cancelled_waiter_leaves_the_queue():
    p = _pool()
    inst = p.add_instance("http://127.0.0.1:9001", ready=True)
    hold = await p.acquire(REQ, PriorityClass.REALTIME)
    waiting = asyncio.create_task(p.acquire(REQ, PriorityClass.REALTIME))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert p.stats().queue_depth["realtime"] == 0
    assert p.queue_stats()[PriorityClass.REALTIME].removed == 1
    p.release(hold, Outcome.SUCCESS)
    assert inst.inflight == 0


async def test_starting_instances_make_requests_wait_until_the_deadline():
    p = _pool(rt_deadline=0.1)
    p.add_instance("http://127.0.0.1:9001")  # not ready yet, never was
    with pytest.raises(QueueTimeout, match="no instance is ready and healthy"):
        await p.acquire(REQ, PriorityClass.REALTIME)


async def test_a_starting_instance_serves_waiters_once_ready():
    p = _pool()
    inst = p.add_instance("http://127.0.0.1:9001")
    waiting = asyncio.create_task(p.acquire(REQ, PriorityClass.REALTIME))
    await asyncio.sleep(0.01)
    p.set_ready(inst, True)  # what the monitor does when /ready passes
    assert inst.has_been_ready and inst.accepting
    assert (await asyncio.wait_for(waiting, 1)).instance is inst


async def test_failed_instances_make_requests_fail_fast():
    p = _pool(target=1)
    inst = p.add_instance("http://127.0.0.1:9001", ready=True)
    lease = await p.acquire(REQ, PriorityClass.REALTIME)
    waiting = asyncio.create_task(p.acquire(REQ, PriorityClass.REALTIME))
    await asyncio.sleep(0.01)
    p.release(lease, Outcome.FAILURE)  # threshold 1: the breaker opens
    with pytest.raises(NoHealthyInstance):
        await asyncio.wait_for(waiting, 1)
    with pytest.raises(NoHealthyInstance) as e:
        await p.acquire(REQ, PriorityClass.BATCH)
    assert inst.inflight == 0
    # the client is told when the breaker lets a probe through (its cool-off), not left to guess
    assert math.ceil(inst.breaker.config.cooloff_s) - 5 <= e.value.retry_after_s <= math.ceil(inst.breaker.config.cooloff_s)


async def test_an_empty_pool_waits_for_instances_to_be_added():
    p = _pool()
    waiting = asyncio.create_task(p.acquire(REQ, PriorityClass.BATCH))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    inst = p.add_instance("http://127.0.0.1:9002", "new", ready=True)
    assert (await asyncio.wait_for(waiting, 1)).instance is inst


async def test_draining_and_removed_instances_get_nothing_new():
    p = _pool(target=10)
    a = p.add_instance("http://127.0.0.1:9001", "a", ready=True)
    b = p.add_instance("http://127.0.0.1:9002", "b", ready=True)
    p.set_draining("a")
    leases = [await p.acquire(REQ, PriorityClass.REALTIME) for _ in range(5)]
    assert all(lease.instance is b for lease in leases)
    p.set_draining("a", False)
    p.remove_instance("b")
    lease = await p.acquire(REQ, PriorityClass.REALTIME)
    assert lease.instance is a
    for old in leases:  # releasing leases of a removed instance is fine
        p.release(old, Outcome.SUCCESS)
    assert b.inflight == 0 and [i.instance_id for i in p.instances()] == ["a"]
    with pytest.raises(ValueError):
        p.add_instance("http://127.0.0.1:9001/")
    with pytest.raises(ValueError):
        p.add_instance("http://127.0.0.1:9003", "a")


async def test_signals_count_admissions_rejections_and_dispatches():
    p = Pool("m/v1", concurrency=ConcurrencyConfig(fixed=1),
             admission=AdmissionConfig(realtime=ClassLimits(max_queue=1, deadline_s=5.0)))
    p.add_instance("http://127.0.0.1:9001", ready=True)
    lease = await p.acquire(REQ, PriorityClass.REALTIME)
    waiting = asyncio.create_task(p.acquire(REQ, PriorityClass.REALTIME))
    await asyncio.sleep(0.01)
    with pytest.raises(Exception, match="queue is full"):
        await p.acquire(REQ, PriorityClass.REALTIME)
    sig = p.stats()
    assert (sig.instances, sig.routable, sig.inflight) == (1, 1, 1)
    assert sig.queue_depth == {"realtime": 1, "batch": 0}
    assert (sig.admitted_total, sig.rejected_total, sig.dispatched_total) == (2, 1, 1)
    p.release(lease, Outcome.SUCCESS)
    p.release(await waiting, Outcome.SUCCESS)
    assert p.stats().dispatched_total == 2


async def test_a_pool_that_can_grow_queues_while_its_only_instance_drains():
    p = _pool()
    p.can_grow = True  # as an elastic controller sets it: it revives or starts one
    inst = p.add_instance("http://127.0.0.1:9003", "old", ready=True)
    p.set_draining("old")
    assert p.cold()
    waiting = asyncio.create_task(p.acquire(REQ, PriorityClass.REALTIME))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    p.set_draining("old", False)  # revived
    assert (await asyncio.wait_for(waiting, 1)).instance is inst and not p.cold()


async def test_a_pool_that_can_grow_queues_while_its_only_instance_is_dead_but_fails_fast_when_fixed():
    """An instance gone unready (killed: its replacement is on the way) leaves an elastic
    pool waiting for the replacement; a fixed pool has none coming and fails fast."""
    for can_grow in (True, False):
        p = _pool()
        p.can_grow = can_grow
        dead = p.add_instance("http://127.0.0.1:9003", "dead", ready=True)
        p.set_ready(dead, False)
        if not can_grow:
            with pytest.raises(NoHealthyInstance):
                await p.acquire(REQ, PriorityClass.REALTIME)
            continue
        waiting = asyncio.create_task(p.acquire(REQ, PriorityClass.REALTIME, exclude=["dead"]))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        new = p.add_instance("http://127.0.0.1:9013", "new")
        p.set_ready(new, True)
        assert (await asyncio.wait_for(waiting, 1)).instance is new


async def test_a_fixed_pool_with_only_draining_instances_fails_fast():
    p = _pool()
    p.add_instance("http://127.0.0.1:9004", "old", ready=True)
    p.set_draining("old")
    with pytest.raises(NoHealthyInstance) as e:
        await p.acquire(REQ, PriorityClass.REALTIME)
    assert e.value.retry_after_s >= 1  # no breaker open: a health check's time


async def test_capacity_shortfall_is_cold_or_a_queue_behind_healthy_instances_only():
    p = _pool(target=1)
    p.add_instance("http://127.0.0.1:9005", "a", ready=True)
    assert p.capacity_shortfall() is None  # a fixed pool: its shortfalls are its own
    p.can_grow = True
    assert p.capacity_shortfall() is None
    lease = await p.acquire(REQ, PriorityClass.REALTIME)
    waiting = asyncio.create_task(p.acquire(REQ, PriorityClass.REALTIME))
    await asyncio.sleep(0.01)
    assert "queued for capacity (1 waiting)" in p.capacity_shortfall()
    p.release(lease, Outcome.FAILURE)  # threshold 1: the breaker opens: a failing pool, not a short one
    assert p.capacity_shortfall() is None
    waiting.cancel()
    p.get("a").ready = False
    assert "no ready instance" in p.capacity_shortfall()


async def test_an_instance_has_not_been_ready_until_its_first_ready_pass_and_a_health_dip_is_not_a_drain():
    p = _pool()
    inst = p.add_instance("http://127.0.0.1:9006", "a")
    assert not inst.has_been_ready and inst.accepting and "state" not in p.snapshot()[0]
    p.set_ready(inst, True)
    assert inst.has_been_ready
    p.set_ready(inst, False)  # unreachable for a moment: unhealthy, still an instance that was ready
    assert inst.has_been_ready and inst.accepting and not inst.ready
    p.set_draining("a")
    assert not inst.accepting and p.snapshot()[0]["draining"]
    p.set_ready(inst, True)  # a /ready pass does not end a drain
    assert not inst.accepting
    p.set_draining("a", False)
    assert inst.accepting and inst.has_been_ready


async def test_an_instance_back_from_a_drain_while_failing_its_checks_is_waited_for_again():
    p = _pool()
    inst = p.add_instance("http://127.0.0.1:9007", "a", ready=True)
    p.set_draining("a")
    p.set_ready(inst, False)
    p.set_draining("a", False)
    assert not inst.has_been_ready  # requests wait for it rather than fail fast
    assert not p._broken(p.views(0.0))
    p.set_ready(inst, True)
    assert inst.has_been_ready and p.views(0.0)[0].routable


async def test_a_new_instance_takes_one_request_until_it_reports_its_seats():
    """Added at /ready, its first load report a poll away: it must not take the whole queue
    at the default seats (a 2-seat instance took 6 that way while the other one idled)."""
    from llmserve.gateway.admission import ConcurrencyConfig as Concurrency

    from .conftest import load_report

    p = Pool("m/v1", concurrency=Concurrency(),
             admission=AdmissionConfig(realtime=ClassLimits(max_queue=10, deadline_s=5.0),
                                       batch=ClassLimits(max_queue=10, deadline_s=5.0), batch_min_share=0.0))
    inst = p.add_instance("http://127.0.0.1:9001", ready=True)
    first = await p.acquire(REQ, PriorityClass.REALTIME)
    waiting = [asyncio.create_task(p.acquire(REQ, PriorityClass.REALTIME)) for _ in range(3)]
    await asyncio.sleep(0.01)
    assert first.instance is inst and inst.inflight == 1 and not any(w.done() for w in waiting)
    inst.report = load_report(max_num_seqs=2, num_running=1)  # what the monitor's first poll sets
    inst.inflight_at_report, inst.report_at = 1, time.monotonic()
    p.pump()
    await asyncio.sleep(0.01)
    assert sum(w.done() for w in waiting) == 1 and inst.inflight == 2
    for w in waiting:
        w.cancel()
