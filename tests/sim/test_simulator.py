"""End-to-end properties of the simulator: queueing sanity, conservation, determinism, cost."""

import numpy as np
import pytest

from llmserve.autoscale import AutoscaleConfig, BoundsConfig, SLOConfig, StaticConfig
from llmserve.gateway.admission import AdmissionConfig, ClassLimits
from llmserve.gateway.balancer import Picker
from llmserve.lifecycle import InstanceState
from llmserve.sim.instance import SimInstance
from llmserve.sim.profile import InstanceProfile, StepModel
from llmserve.sim.results import COMPLETED, EXPIRED, PENDING, REJECTED
from llmserve.sim.simulator import SimConfig, Simulator
from llmserve.sim.traces import LengthDist, Trace, bursty, ramp

UNLIMITED = AdmissionConfig(realtime=ClassLimits(max_queue=10**6, deadline_s=1e9),
                            batch=ClassLimits(max_queue=10**6, deadline_s=1e9))


def small_profile(**kw):
    base = dict(name="small", step=StepModel(0.01, 1e-4, 2e-3, 1e-6), max_num_seqs=4, max_num_batched_tokens=256,
                kv_capacity_tokens=100_000, cold_start_s=20.0, warmup_s=5.0)
    base.update(kw)
    return InstanceProfile(**base)


def static(n):
    return AutoscaleConfig(policy="static", static=StaticConfig(instances=n))


def short_trace(seed=0, **kw):
    args = dict(low_rps=0.5, high_rps=4.0, hold_s=120.0, ramp_s=240.0, seed=seed,
                prompt=LengthDist(60, 0.7, 4, 400), output=LengthDist(40, 0.7, 2, 300))
    args.update(kw)
    return ramp(**args)


def test_mg1_mean_wait_matches_pollaczek_khinchine():
    """One instance, batch of one, one-token prompts, geometric outputs: a FIFO M/G/1 queue.

    Service is K steps of ``a`` seconds with K ~ Geometric(p); the mean wait in the
    queue is lambda * E[S^2] / (2 (1 - rho)), and TTFT is that wait plus one step.
    """
    a, p, lam, n = 0.01, 0.05, 3.5, 40_000
    rng = np.random.default_rng(1)
    arrivals = np.cumsum(rng.exponential(1 / lam, n))
    k = rng.geometric(p, n)
    trace = Trace("mg1", arrivals, np.ones(n, np.int64), k.astype(np.int64), np.zeros(n, np.int8),
                  float(arrivals[-1]) + 1)
    prof = small_profile(step=StepModel(a, 0.0, 0.0, 0.0), max_num_seqs=1, max_num_batched_tokens=1)
    res = Simulator(trace, prof, static(1), SimConfig(initial_instances=1), admission=UNLIMITED).run()
    es, es2 = a / p, a * a * (2 - p) / (p * p)
    rho = lam * es
    expected_wait = lam * es2 / (2 * (1 - rho))
    measured_wait = float(np.mean(res.ttft)) - a
    assert rho == pytest.approx(0.7)
    assert measured_wait == pytest.approx(expected_wait, rel=0.1)
    assert np.all(res.status == COMPLETED)
    # e2e = TTFT + the remaining K-1 steps, exactly.
    np.testing.assert_allclose(res.e2e - res.ttft, (k - 1) * a, atol=1e-9)


def test_every_request_ends_exactly_once_under_overload_and_scaling():
    trace = bursty(base_rps=3.0, burst_factor=6.0, bursts_per_hour=6.0, duration_s=1800.0, seed=3,
                   prompt=LengthDist(80, 0.8, 4, 600), output=LengthDist(60, 0.8, 2, 400), batch_fraction=0.3)
    admission = AdmissionConfig(realtime=ClassLimits(max_queue=20, deadline_s=5.0),
                                batch=ClassLimits(max_queue=40, deadline_s=20.0))
    cfg = AutoscaleConfig(policy="threshold", tick_s=2.0, bounds=BoundsConfig(max_instances=4))
    sim = Simulator(trace, small_profile(), cfg, SimConfig(initial_instances=1), admission=admission)
    res = sim.run()
    s = res.summary
    assert not np.any(res.status == PENDING)
    assert s.completed + s.rejected + s.expired == s.requests == len(trace)
    assert s.rejected > 0 and s.expired > 0  # the caps and deadlines did bite
    done = res.status == COMPLETED
    assert np.all(np.isfinite(res.e2e[done])) and np.all(np.isnan(res.e2e[~done]))
    assert np.all(res.ttft[done] <= res.e2e[done] + 1e-9)
    assert np.all(np.isnan(res.ttft[(res.status == REJECTED) | (res.status == EXPIRED)]))
    assert all(i.in_flight == 0 for i in [*sim.instances.values(), *sim.book.finished])


def test_same_seed_same_run_and_another_seed_differs():
    def run(seed):
        cfg = AutoscaleConfig(policy="predictive", slo=SLOConfig(ttft_s=1.0))
        return Simulator(short_trace(seed), small_profile(), cfg, SimConfig(initial_instances=1, seed=seed)).run()

    a, b, c = run(0), run(0), run(1)
    np.testing.assert_array_equal(a.ttft, b.ttft)
    np.testing.assert_array_equal(a.e2e, b.e2e)
    assert a.events == b.events
    assert a.summary.instance_hours == b.summary.instance_hours
    assert len(a.ttft) != len(c.ttft) or not np.array_equal(a.ttft, c.ttft)


@pytest.mark.parametrize("n", [1, 3])
def test_static_cost_is_instances_times_hours(n):
    trace = short_trace()
    res = Simulator(trace, small_profile(), static(n), SimConfig(initial_instances=n)).run()
    assert res.summary.instance_hours == pytest.approx(n * trace.duration_s / 3600.0)
    assert res.summary.scale_events == 0


def test_warming_instances_get_no_traffic_and_draining_ones_finish_their_work(monkeypatch):
    states_at_add = []
    original = SimInstance.add

    def add(self, seq, now):
        states_at_add.append(self.state)
        return original(self, seq, now)

    monkeypatch.setattr(SimInstance, "add", add)
    cfg = AutoscaleConfig(policy="kpa", bounds=BoundsConfig(scale_down_window_s=30.0))
    sim = Simulator(short_trace(), small_profile(), cfg, SimConfig(initial_instances=1))
    res = sim.run()
    assert states_at_add and set(states_at_add) == {InstanceState.READY}
    starts = [e for e in res.events if e[2] > e[1]]
    downs = [e for e in res.events if e[2] < e[1]]
    assert starts and downs  # it did scale both ways
    assert np.all(res.status == COMPLETED)


def test_cold_start_delays_new_capacity():
    sim = Simulator(short_trace(), small_profile(cold_start_s=45.0, warmup_s=5.0),
                    AutoscaleConfig(policy="threshold"), SimConfig(initial_instances=1))
    ready_at = []
    sim.book.listeners.append(lambda inst, old, new, now: ready_at.append(now - inst.created)
                              if new is InstanceState.READY and old is InstanceState.WARMING and now > 0 else None)
    sim.run()
    assert ready_at and all(t == pytest.approx(45.0) for t in ready_at)


def test_the_real_balancer_and_policy_stack_are_called(monkeypatch):
    picks = []
    original = Picker.choose

    def choose(self, request, candidates):
        chosen = original(self, request, candidates)
        picks.append(chosen in candidates)
        return chosen

    monkeypatch.setattr(Picker, "choose", choose)  # what the live pool's dispatcher calls
    trace = short_trace()
    res = Simulator(trace, small_profile(), static(2), SimConfig(initial_instances=2)).run()
    assert sum(picks) == int(np.sum(res.status == COMPLETED)) == len(trace)


def test_more_instances_never_hurt_latency_in_a_static_pool():
    trace = short_trace(high_rps=6.0)
    att = [Simulator(trace, small_profile(), static(n).model_copy(update={"slo": SLOConfig(ttft_s=0.5)}),
                     SimConfig(initial_instances=n)).run().summary.ttft_attainment for n in (1, 2, 4)]
    assert att[0] < att[1] <= att[2]


def test_the_simulated_load_reports_give_every_field():
    """model_construct fills a left-out default_factory field by inspecting the factory's
    signature, per report: one field left out made a simulated day twice as long."""
    from llmserve.load_report import LoadReport

    sim = Simulator(short_trace(hold_s=20.0, ramp_s=20.0), small_profile(), static(2), SimConfig(seed=0))
    seen = []
    real = sim.gateway.reports
    sim.gateway.reports = lambda: seen.extend(real()) or real()
    sim.run()
    assert seen and all(r.model_fields_set == set(LoadReport.model_fields) for r in seen)
