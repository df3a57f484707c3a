import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmserve.gateway.admission import (AdmissionConfig, AdmissionQueue, Admitted, ClassLimits,
                                        ConcurrencyConfig, Rejected, RoomLimits, concurrency_target,
                                        has_batch_room, has_room)
from llmserve.gateway.instance import InstanceView
from llmserve.priority import PriorityClass
from tests.gateway.conftest import load_report


def _cfg(rt_cap=100, rt_deadline=10.0, b_cap=100, b_deadline=100.0, share=0.2):
    return AdmissionConfig(realtime=ClassLimits(max_queue=rt_cap, deadline_s=rt_deadline),
                           batch=ClassLimits(max_queue=b_cap, deadline_s=b_deadline),
                           batch_min_share=share)


def test_realtime_goes_first_fifo_within_class():
    q = AdmissionQueue[str](_cfg(share=0.0))
    q.offer("b1", PriorityClass.BATCH, 0.0)
    q.offer("r1", PriorityClass.REALTIME, 1.0)
    q.offer("r2", PriorityClass.REALTIME, 2.0)
    out = [q.next_to_dispatch(3.0, True).item for _ in range(3)]
    assert out == ["r1", "r2", "b1"]
    assert q.next_to_dispatch(3.0, True) is None


def test_batch_gets_its_minimum_share_while_realtime_waits():
    q = AdmissionQueue[int](_cfg(rt_cap=10_000, b_cap=10_000, share=0.2))
    for i in range(1000):
        q.offer(i, PriorityClass.REALTIME, 0.0)
        q.offer(i, PriorityClass.BATCH, 0.0)
    got = [q.next_to_dispatch(1.0, True).priority for _ in range(500)]
    assert got.count(PriorityClass.BATCH) == 100
    # never more than 4 realtime in a row at share 0.2
    run = longest = 0
    for p in got:
        run = run + 1 if p is PriorityClass.REALTIME else 0
        longest = max(longest, run)
    assert longest == 4


def test_zero_share_lets_realtime_starve_batch_as_configured():
    q = AdmissionQueue[int](_cfg(share=0.0))
    for i in range(50):
        q.offer(i, PriorityClass.REALTIME, 0.0)
    q.offer(-1, PriorityClass.BATCH, 0.0)
    got = [q.next_to_dispatch(1.0, True).priority for _ in range(50)]
    assert PriorityClass.BATCH not in got


def test_no_capacity_dispatches_nothing_and_loses_nothing():
    q = AdmissionQueue[str](_cfg())
    q.offer("a", PriorityClass.REALTIME, 0.0)
    assert q.next_to_dispatch(1.0, has_capacity=False) is None
    assert len(q) == 1
    assert q.next_to_dispatch(1.0, has_capacity=True).item == "a"


def test_caps_reject_with_429_and_retry_after():
    q = AdmissionQueue[int](_cfg(rt_cap=3, rt_deadline=30.0))
    results = [q.offer(i, PriorityClass.REALTIME, 0.0) for i in range(4)]
    assert all(isinstance(r, Admitted) for r in results[:3])
    rej = results[3]
    assert isinstance(rej, Rejected) and rej.status == 429
    assert rej.retry_after_s == 30  # nothing dispatched yet: the deadline
    assert "realtime queue is full" in rej.reason
    # batch has its own cap
    assert isinstance(q.offer(9, PriorityClass.BATCH, 0.0), Admitted)
    # with a known dispatch rate (3 in 10 s) retry-after is depth / rate
    for _ in range(3):
        q.next_to_dispatch(1.0, True)
    for i in range(3):
        q.offer(i, PriorityClass.REALTIME, 2.0)
    rej = q.offer(99, PriorityClass.REALTIME, 2.0)
    assert isinstance(rej, Rejected) and rej.retry_after_s == 10  # 3 / 0.3 per s
    assert q.stats(2.0)[PriorityClass.REALTIME].rejected == 2


def test_deadline_expires_items_with_a_reason_and_never_dispatches_them():
    q = AdmissionQueue[str](_cfg(rt_deadline=5.0, b_deadline=50.0))
    q.offer("late", PriorityClass.REALTIME, 0.0)
    q.offer("batch", PriorityClass.BATCH, 0.0)
    q.offer("fresh", PriorityClass.REALTIME, 4.0)
    d = q.next_to_dispatch(6.0, True)
    assert d.item == "fresh"
    expired = q.expire(6.0)
    assert [e.entry.item for e in expired] == ["late"]
    assert expired[0].waited_s == 6.0 and "deadline of 5 s" in expired[0].reason
    assert q.expire(6.0) == []
    assert q.next_deadline() == 50.0
    assert [e.entry.item for e in q.expire(50.0)] == ["batch"]
    assert len(q) == 0


def test_remove_withdraws_a_waiting_item():
    q = AdmissionQueue[str](_cfg())
    t = q.offer("gone", PriorityClass.BATCH, 0.0)
    assert q.remove(t.ticket) and not q.remove(t.ticket)
    assert q.next_to_dispatch(1.0, True) is None


def test_stats_report_depth_wait_and_counts():
    q = AdmissionQueue[str](_cfg())
    q.offer("a", PriorityClass.REALTIME, 0.0)
    q.offer("b", PriorityClass.REALTIME, 1.0)
    q.next_to_dispatch(3.0, True)
    s = q.stats(4.0)[PriorityClass.REALTIME]
    assert (s.depth, s.admitted, s.dispatched, s.wait_s_sum) == (1, 2, 1, 3.0)
    assert s.oldest_wait_s == 3.0


# ---- property: nothing offered is lost ---------------------------------------------

OPS = st.lists(st.one_of(
    st.tuples(st.just("offer"), st.sampled_from(list(PriorityClass))),
    st.tuples(st.just("dispatch"), st.booleans()),
    st.tuples(st.just("expire"), st.none()),
    st.tuples(st.just("remove"), st.integers(0, 50)),
    st.tuples(st.just("wait"), st.floats(0.0, 4.0)),
), max_size=150)


@settings(max_examples=200, deadline=None)
@given(OPS, st.floats(0.0, 1.0))
def test_every_admitted_item_is_dispatched_expired_removed_or_queued(ops, share):
    q = AdmissionQueue[int](_cfg(rt_cap=8, rt_deadline=3.0, b_cap=12, b_deadline=9.0,
                                 share=share))
    now, n = 0.0, 0
    admitted: dict[int, tuple[int, float, PriorityClass]] = {}  # item -> (ticket, deadline, class)
    dispatched, expired, removed, rejected = [], [], [], []
    for op, arg in ops:
        if op == "offer":
            r = q.offer(n, arg, now)
            if isinstance(r, Admitted):
                admitted[n] = (r.ticket, now + q.config.limits(arg).deadline_s, arg)
            else:
                rejected.append(n)
            n += 1
        elif op == "dispatch":
            before = len(q)
            d = q.next_to_dispatch(now, arg)
            if d is not None:
                assert arg
                assert d.deadline > now  # never dispatch an expired item
                dispatched.append(d.item)
            else:
                # nothing dispatchable: no capacity, or all waiting items had expired
                assert not arg or len(q) == 0 or before == 0
        elif op == "expire":
            for e in q.expire(now):
                assert e.entry.deadline <= now
                expired.append(e.entry.item)
        elif op == "remove":
            if arg in admitted and q.remove(admitted[arg][0]):
                removed.append(arg)
        else:
            now += arg
    queued = [e.entry.item for e in q.expire(float("inf"))]
    outcomes = dispatched + expired + removed + queued
    assert sorted(outcomes) == sorted(admitted)  # each exactly once
    assert not set(rejected) & set(outcomes)
    stats = q.stats(now)
    assert sum(s.admitted for s in stats.values()) == len(admitted)
    assert sum(s.rejected for s in stats.values()) == len(rejected)


@settings(max_examples=100, deadline=None)
@given(st.floats(0.05, 1.0), st.integers(20, 200))
def test_batch_share_holds_under_contention(share, k):
    q = AdmissionQueue[int](_cfg(rt_cap=1000, b_cap=1000, share=share))
    for i in range(k):
        q.offer(i, PriorityClass.REALTIME, 0.0)
        q.offer(i, PriorityClass.BATCH, 0.0)
    got = [q.next_to_dispatch(0.5, True).priority for _ in range(k)]
    assert got.count(PriorityClass.BATCH) >= int(share * k + 1e-9)
    assert got.count(PriorityClass.BATCH) <= int(share * k + 1e-9) + 1


# ---- per-instance room -------------------------------------------------------------

def test_concurrency_target_sources(make_report):
    assert concurrency_target(make_report(max_num_seqs=16), ConcurrencyConfig()) == 16
    assert concurrency_target(make_report(max_num_seqs=16),
                              ConcurrencyConfig(oversubscription=1.5)) == 24
    assert concurrency_target(make_report(max_num_seqs=16), ConcurrencyConfig(fixed=4)) == 4
    assert concurrency_target(make_report(max_num_seqs=0), ConcurrencyConfig(default=3)) == 3
    # not reported yet: one request (a new instance must not take a whole queue before it
    # says its seats: it took 6 where it had 2), unless the pool fixes the target
    assert concurrency_target(None, ConcurrencyConfig()) == 1
    assert concurrency_target(None, ConcurrencyConfig(fixed=4)) == 4


def test_has_room_corrects_a_stale_report_with_own_inflight(make_report):
    cfg = ConcurrencyConfig()
    rep = make_report(num_running=6, num_waiting=1, max_num_seqs=8)
    # report taken with 7 in flight from us; since then we sent 1 more → 8: full
    assert not has_room(InstanceView("a", report=rep, inflight=8, inflight_at_report=7), cfg)
    # since the report, 3 of ours finished → about 4 on the instance: room
    assert has_room(InstanceView("a", report=rep, inflight=4, inflight_at_report=7), cfg)
    # no report yet: one request at a time until it says its seats
    assert has_room(InstanceView("b", inflight=0), cfg)
    assert not has_room(InstanceView("b", inflight=1), cfg)


def test_room_limits_by_seats_say_what_has_room_says():

    configs = [ConcurrencyConfig(), ConcurrencyConfig(fixed=3), ConcurrencyConfig(oversubscription=1.3, default=5),
               ConcurrencyConfig(realtime_reserve=0.5), ConcurrencyConfig(realtime_reserve=0.0)]
    views = [InstanceView("none", inflight=n) for n in range(0, 12)]
    views += [InstanceView("r", inflight=n, inflight_at_report=1,
                           report=load_report(num_running=run, num_waiting=1, max_num_seqs=seats))
              for n in (0, 3, 9) for run in (0, 4, 30) for seats in (0, 1, 7, 64)]
    for c in configs:
        rt, batch = RoomLimits(c), RoomLimits(c, batch=True)
        for v in views:
            assert (v.est_load < rt[v.seats]) == has_room(v, c)
            assert (v.est_load < batch[v.seats]) == has_batch_room(v, c)
