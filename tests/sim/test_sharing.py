"""Core sharing: the slowdown model, its fit, and its effect on simulated instances."""

import pytest

from llmserve.autoscale.book import InstanceBook
from llmserve.lifecycle import InstanceState
from llmserve.sim.instance import Seq, SimInstance
from llmserve.sim.profile import InstanceProfile, StepModel
from llmserve.sim.sharing import BusyInstances, CoreSharing, fit_api_share

STEP = StepModel(base_s=0.1, per_prefill_token_s=0.0, per_decode_seq_s=0.0, per_context_token_s=0.0)


def test_no_slowdown_while_threads_fit_the_cores():
    s = CoreSharing(cores=4, threads=1)
    assert [s.slowdown(b) for b in (0, 1, 2, 4)] == [1.0, 1.0, 1.0, 1.0]
    assert s.slowdown(8) == pytest.approx(2.0)


def test_api_share_makes_two_single_thread_instances_on_two_cores_slower():
    s = CoreSharing(cores=2, threads=1, api_share=0.25)
    assert s.slowdown(2) == pytest.approx(1.25)
    assert s.slowdown(3) == pytest.approx(1.875)


def test_an_instance_that_alone_wants_more_than_the_machine_is_the_baseline():
    # 2 threads of 2 cores, plus serving: already over the machine when calibrated alone.
    s = CoreSharing(cores=2, threads=2, api_share=0.5)
    assert s.slowdown(1) == 1.0
    assert s.slowdown(2) == pytest.approx(2.0)


def test_fit_inverts_the_model():
    for share in (0.0, 0.2, 0.7):
        truth = CoreSharing(2, 1, share)
        assert fit_api_share(2, 1, 2, [truth.slowdown(2)] * 3) == pytest.approx(share)


def test_fit_takes_the_median_and_clamps():
    assert fit_api_share(2, 1, 2, [1.1, 1.3, 9.0]) == pytest.approx(0.3)
    assert fit_api_share(2, 1, 2, [0.8, 0.9, 0.95]) == 0.0  # faster with two busy: noise, no cost
    assert fit_api_share(2, 1, 2, [5.0]) == pytest.approx(1.0)  # beyond what the model reaches


def test_invalid_sharing_is_refused():
    with pytest.raises(ValueError):
        CoreSharing(0, 1)
    with pytest.raises(ValueError):
        CoreSharing(2, 1, -0.1)
    with pytest.raises(ValueError):
        fit_api_share(2, 1, 1, [1.2])


def _profile(sharing):
    return InstanceProfile("t", STEP, max_num_seqs=4, max_num_batched_tokens=64, cold_start_s=1.0,
                           warmup_s=0.0, sharing=sharing)


def test_a_segment_planned_while_another_instance_is_busy_is_stretched():
    sharing = CoreSharing(cores=2, threads=1, api_share=0.5)
    cores = BusyInstances(sharing)
    a = SimInstance(0, _profile(sharing), 0.0, InstanceState.READY, cores)
    b = SimInstance(1, _profile(sharing), 0.0, InstanceState.READY, cores)
    assert a.add(Seq(0, 8, 4), 0.0)
    assert a.seg_end == pytest.approx(0.1)  # alone: the profile's step
    assert b.add(Seq(1, 8, 4), 0.0)
    assert b.seg_end == pytest.approx(0.15)  # two busy: x1.5
    assert cores.busy == {0, 1}
    # b runs to completion, goes idle, and a's next segment is back at full speed.
    while b.kind:
        b.end_segment(b.seg_end)
        b.plan(b.seg_end)
    assert cores.busy == {0}
    a.end_segment(a.seg_end)
    a.plan(a.seg_end)
    assert a.seg_end - a.seg_start == pytest.approx(3 * 0.1)  # 3 decode steps left, alone


def test_a_stopped_instance_is_no_longer_busy():
    sharing = CoreSharing(cores=1, threads=1)
    cores = BusyInstances(sharing)
    a = SimInstance(0, _profile(sharing), 0.0, InstanceState.READY, cores)
    a.add(Seq(0, 8, 4), 0.0)
    book = InstanceBook(lambda: 0.0, lambda: 0.0)  # what the simulator moves its instances with
    book.listeners.append(lambda inst, old, new, now: inst.moved(old, new, now))
    book.add(a, "test")
    for state in (InstanceState.DRAINING, InstanceState.STOPPING):
        book.transition(a, state, "test")
        assert cores.busy == {0}
    book.transition(a, InstanceState.STOPPED, "test")
    assert cores.busy == set() and a.stopped_at == 0.0


def test_profile_round_trips_sharing_and_overhead(tmp_path):
    p = _profile(CoreSharing(2, 1, 0.3))
    p = InstanceProfile.from_dict({**__import__("json").loads(p.to_json()), "request_overhead_s": 0.04})
    again = InstanceProfile.from_dict(__import__("json").loads(p.to_json()))
    assert again.sharing == CoreSharing(2, 1, 0.3)
    assert again.request_overhead_s == pytest.approx(0.04)
    plain = InstanceProfile.from_dict(__import__("json").loads(_profile(None).to_json()))
    assert plain.sharing is None and plain.request_overhead_s == 0.0
    assert "sharing" not in _profile(None).to_json()


def _two_at_once(sharing, overhead=0.0):
    """Two requests arriving together at a static pool of two: one each, both busy."""
    import numpy as np

    from llmserve.autoscale import AutoscaleConfig, StaticConfig
    from llmserve.sim.simulator import SimConfig, Simulator
    from llmserve.sim.traces import Trace

    trace = Trace("two", np.zeros(2), np.full(2, 8), np.full(2, 5), np.zeros(2, np.int8), 10.0)
    prof = InstanceProfile("t", STEP, max_num_seqs=4, max_num_batched_tokens=64, cold_start_s=1.0,
                           warmup_s=0.0, sharing=sharing, request_overhead_s=overhead)
    auto = AutoscaleConfig(policy="static", static=StaticConfig(instances=2))
    return Simulator(trace, prof, auto, SimConfig(initial_instances=2)).run()


def test_the_simulator_slows_instances_busy_together_and_adds_the_request_overhead():
    alone = _two_at_once(None)
    shared = _two_at_once(CoreSharing(cores=2, threads=1, api_share=0.5))
    assert alone.e2e.tolist() == pytest.approx([0.5, 0.5])  # 5 steps of 0.1 s each, one instance each
    # The first instance planned its prefill alone (0.1 s), then both were busy: every later step x1.5.
    assert sorted(shared.e2e.tolist()) == pytest.approx([0.1 + 4 * 0.15, 5 * 0.15])
    late = _two_at_once(None, overhead=0.04)
    assert (late.ttft - alone.ttft).tolist() == pytest.approx([0.04, 0.04])
    assert (late.e2e - alone.e2e).tolist() == pytest.approx([0.04, 0.04])
