"""Instances sharing one machine's cores: a split must be measured to serve more (``autoscale/shared_cores.py``)."""

from __future__ import annotations

import pytest

from llmserve.autoscale.config import AutoscaleConfig
from llmserve.autoscale.shared_cores import CoreBoundPolicy, pool_capacity, useful_instances
from llmserve.autoscale.signals import PoolSignals


def test_an_unmeasured_split_is_priced_linearly_so_one_instance_keeps_the_cores():
    assert pool_capacity(1, 2, {2: 150.0}) == 150.0
    assert pool_capacity(2, 2, {2: 150.0}) == pytest.approx(150.0)  # two at 1 thread: 75 each, priced
    assert useful_instances(2, {2: 150.0}) == 1
    assert useful_instances(2, {1: 70.0}) == 1  # measured only split: one on both cores prices the same
    assert useful_instances(4, {4: 200.0}) == 1
    assert useful_instances(2, {}) == 0  # nothing measured: no cap


def test_a_measured_split_wins_only_when_it_serves_more():
    assert useful_instances(2, {2: 150.0, 1: 90.0}) == 2  # 180 > 150
    assert useful_instances(2, {2: 150.0, 1: 60.0}) == 1  # 120 < 150
    assert useful_instances(2, {2: 150.0, 1: 75.5}) == 1  # within 1 %: fewer instances
    # 4 cores, 3 instances share them 2 + 1 + 1.
    assert pool_capacity(3, 4, {2: 100.0, 1: 60.0}) == pytest.approx(220.0)
    assert useful_instances(4, {4: 150.0, 2: 100.0, 1: 60.0}) == 4  # 240 beats 200, 220 and 150


def _saturated(now: float, by_threads) -> PoolSignals:
    """A closed loop at 64 streams on one ready instance: demand equals what it serves,
    batches full, latency over target (what the c = 64 benchmark looked like)."""
    return PoolSignals(now=now, arrival_rate=0.6, arrival_tokens_per_s=140.0, ready=1, running=64,
                       dispatched=64, batch_fill=1.0, seats_per_instance=64, throughput_per_instance=140.0,
                       modelled_capacity=dict(by_threads).get(2, 0.0), modelled_by_threads=tuple(by_threads),
                       ttft_p99=6.0, e2e_p99=70.0)


def test_a_saturated_instance_on_shared_cores_is_not_split_unless_splitting_was_measured_faster():
    from llmserve.autoscale.build import build_inner_policy, build_policy

    auto = AutoscaleConfig.model_validate({"policy": "predictive", "bounds": {"min_instances": 1,
                                                                              "max_instances": 2}})
    bare = build_inner_policy(auto)
    capped = CoreBoundPolicy(bare, 2)
    b_state, c_state = bare.initial_state(), capped.initial_state()
    for i in range(10):
        ctx = _saturated(2.0 * (i + 1), [(2, 150.0)])
        b, c = bare.decide(ctx, b_state), capped.decide(ctx, c_state)
        b_state, c_state = b.state, c.state
    assert b.desired >= 2  # the bare policy reads saturation as a need for a second instance...
    assert c.desired == 1 and "capped at 1" in c.reason  # ...which would only halve this one's cores
    # Once two instances ran on 1 thread each and served more together, the split is allowed;
    # the 2-thread measurement is remembered though no instance reports it now.
    c = capped.decide(_saturated(30.0, [(1, 95.0)]), c_state)
    assert c.desired == 2 and "capped" not in c.reason and dict(c.state.by_threads) == {1: 95.0, 2: 150.0}
    # What serve builds for a local pool (cap_to_cores) carries the wrap; other pools run bare.
    from llmserve.autoscale.core_share import cap_to_cores

    shared = cap_to_cores(auto, 2)
    assert shared.shared_cores == 2 and isinstance(build_policy(shared).inner, CoreBoundPolicy)
    assert not isinstance(build_policy(auto).inner, CoreBoundPolicy)
    static = cap_to_cores(AutoscaleConfig.model_validate({"policy": "static", "static": {"instances": 2}}), 2)
    assert build_policy(static).inner.decide(PoolSignals(now=1.0), build_policy(static).inner.initial_state()
                                             ).desired == 2  # a count the user fixed is theirs


def test_the_collector_reports_step_model_capacity_per_thread_count():
    from llmserve.autoscale.collector import SignalCollector
    from llmserve.autoscale.saturation import modelled_capacity
    from llmserve.lifecycle import InstanceState
    from llmserve.load_report import LoadReport

    def report(iid, threads, decode_seq_s):
        return LoadReport(instance_id=iid, model="m", ready=True, draining=False, num_running=1, num_waiting=0,
                          num_waiting_by_priority={}, kv_cache_usage=0.0, busy_fraction=0.1, tokens_per_s=10.0,
                          generation_tokens_per_s=5.0, max_num_seqs=16, prefix_cache_hit_rate=0.0, timestamp=0.0,
                          threads=threads,
                          step_costs={"base_s": 0.01, "prefill_token_s": 0.001, "decode_seq_s": decode_seq_s})

    col = SignalCollector(output_tokens_prior=64.0)
    col.record_arrival(0.5, 32)
    ctx = col.snapshot(1.0, [report("a", 1, 0.004), report("b", 1, 0.006), report("c", 2, 0.002)], {},
                       {InstanceState.READY: 3})
    one = [modelled_capacity(0.01, 0.001, d, 16, 32, 64) for d in (0.004, 0.006)]
    (t1, c1), (t2, c2) = ctx.modelled_by_threads
    assert (t1, t2) == (1, 2)
    assert c1 == pytest.approx(sum(one) / 2) and c2 == pytest.approx(modelled_capacity(0.01, 0.001, 0.002, 16, 32, 64))
