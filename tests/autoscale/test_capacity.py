import pytest

from llmserve.autoscale.capacity import CapacityEstimate, update_capacity
from llmserve.autoscale.config import PredictiveConfig, SLOConfig
from llmserve.autoscale.signals import PoolSignals

CFG = PredictiveConfig(capacity_tokens_per_s=1000.0, capacity_tau_s=60.0, capacity_probe_per_s=0.001,
                       capacity_probe_ceiling=1.5, capacity_low_water=0.6)
SLO = SLOConfig(ttft_s=2.0, e2e_s=60.0)


def feed(est, seq, dt=10.0):
    for i, (tput, ttft) in enumerate(seq):
        ctx = PoolSignals(now=dt * (i + 1), ready=4, throughput_per_instance=tput, ttft_p99=ttft, e2e_p99=10.0)
        est = update_capacity(est, ctx, CFG, SLO)
    return est


def test_violations_pull_the_estimate_down_towards_what_was_served():
    est = feed(CapacityEstimate(1000.0, 0.0), [(600.0, 5.0)] * 60)
    assert est.tokens_per_s == pytest.approx(600.0, rel=0.01)
    assert est.violations == 60


def test_one_bad_tick_does_not_halve_the_estimate():
    est = feed(CapacityEstimate(1000.0, 0.0), [(500.0, 5.0)])
    assert est.tokens_per_s > 900.0


def test_served_within_slo_is_a_lower_bound():
    est = feed(CapacityEstimate(1000.0, 0.0), [(1400.0, 1.9)])
    assert est.tokens_per_s == pytest.approx(1400.0)


def test_probe_rises_when_loaded_and_fast_but_not_beyond_the_ceiling():
    est = feed(CapacityEstimate(1000.0, 0.0), [(800.0, 0.5)] * 500)
    assert est.tokens_per_s == pytest.approx(800.0 * 1.5)


def test_no_probe_when_lightly_loaded():
    est = feed(CapacityEstimate(1000.0, 0.0), [(100.0, 0.2)] * 500)
    assert est.tokens_per_s == 1000.0


def test_no_latency_samples_means_no_update():
    est = CapacityEstimate(1000.0, 0.0)
    ctx = PoolSignals(now=10.0, ready=2, throughput_per_instance=5000.0)
    assert update_capacity(est, ctx, CFG, SLO).tokens_per_s == 1000.0
