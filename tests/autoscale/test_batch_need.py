"""Batch work in a pool's size (issue 33): idle capacity first, instances only for a window.

Each policy sees the same realtime load three ways: alone; with a batch backlog
running beside it (batch arrivals, a batch queue, batch lines in the engines)
whose window is loose; and with the same backlog under a tight window. The loose
one must change nothing, the tight one must add instances.
"""

from dataclasses import replace

import pytest

from llmserve.autoscale import AutoscaleConfig, KPAConfig, PoolSignals, PredictiveConfig, build_policy
from llmserve.autoscale.batch_need import observed_capacity, with_batch_need
from llmserve.gateway.batches.pace import required_rate

TOKENS_PER_LINE = 500.0
REALTIME = PoolSignals(now=0.0, arrival_rate=4.0, arrival_tokens_per_s=2000.0, running=20, dispatched=20,
                       batch_fill=0.5, busy_fraction=0.5, kv_usage=0.5, seats_per_instance=10.0,
                       throughput_per_instance=500.0, modelled_capacity=1000.0, ttft_p99=0.5, ready=4)


def with_backlog(ctx: PoolSignals, lines: int, window_s: float) -> PoolSignals:
    """``ctx`` plus batch lines filling idle seats: 2 lines/s arriving, 50 queued, 10 running."""
    need = required_rate(lines, window_s) * TOKENS_PER_LINE
    return replace(ctx, arrival_rate=ctx.arrival_rate + 2.0, arrival_tokens_per_s=ctx.arrival_tokens_per_s + 1000.0,
                   batch_arrival_rate=2.0, batch_arrival_tokens_per_s=1000.0, queue_depth={"batch": 50},
                   running=ctx.running + 10, dispatched=ctx.dispatched + 10, batch_dispatched=10,
                   batch_fill=0.75, busy_fraction=0.75, kv_usage=0.75, batch_need_tokens_per_s=need)


def most_desired(name: str, make) -> int:
    """The most instances the policy (in its bounds) asks for over ten minutes of ``make``'s signals."""
    cfg = AutoscaleConfig(policy=name, kpa=KPAConfig(target_concurrency=8.0),
                          predictive=PredictiveConfig(capacity_tokens_per_s=1000.0, target_utilisation=0.9,
                                                      margin_z=1.0))
    policy = build_policy(cfg)
    state = policy.initial_state()
    most = 0
    for t in range(2, 602, 2):
        d = policy.decide(make(replace(REALTIME, now=float(t))), state)
        state, most = d.state, max(most, d.desired)
    return most


@pytest.mark.parametrize("name", ["predictive", "threshold", "kpa"])
def test_a_loose_window_adds_no_instance_and_a_tight_one_does(name):
    alone = most_desired(name, lambda c: c)
    loose = most_desired(name, lambda c: with_backlog(c, 2_000, 20 * 3600.0))
    tight = most_desired(name, lambda c: with_backlog(c, 10_000, 3600.0))
    assert alone >= 1
    assert loose == alone  # the backlog, its arrivals and its queue are not demand
    assert tight > alone  # 10,000 lines in an hour do not fit the realtime pool's idle capacity


def test_the_need_fits_idle_capacity_before_it_adds_instances():
    # 4 instances of 1000 tok/s at 0.9 carry 3600 tok/s: 2000 realtime leaves 1600 for a batch
    assert with_batch_need(4, 2000.0, 1600.0, 1000.0, 0.9) == 4
    assert with_batch_need(4, 2000.0, 1700.0, 1000.0, 0.9) == 5
    assert with_batch_need(4, 2000.0, 0.0, 1000.0, 0.9) == 4
    assert with_batch_need(4, 2000.0, 5000.0, 0.0, 0.9) == 4  # unmeasured capacity: no growth for a batch
    assert with_batch_need(0, 0.0, 1.0, 1000.0, 0.9) == 1  # a batch with no instance at all needs one


def test_realtime_views_leave_the_batch_class_out():
    ctx = with_backlog(REALTIME, 2_000, 3600.0)
    assert ctx.realtime_tokens_per_s == REALTIME.arrival_tokens_per_s
    assert ctx.realtime_queued == 0 and ctx.queued == 50
    assert ctx.realtime_in_flight == REALTIME.in_flight == 20
    assert ctx.realtime_share == pytest.approx(20 / 30)
    assert REALTIME.realtime_share == 1.0
    assert observed_capacity(REALTIME) == 1000.0
    assert observed_capacity(replace(REALTIME, modelled_capacity=0.0)) == 1000.0  # 500 tok/s at fill 0.5
