import pytest

from llmserve.autoscale.saturation import CapacityEstimate, update_capacity
from llmserve.autoscale.config import PredictiveConfig
from llmserve.autoscale.signals import PoolSignals

CFG = PredictiveConfig(capacity_tokens_per_s=1000.0, capacity_tau_s=60.0, capacity_measure_fill=0.9)


def feed(est, seq, dt=10.0):
    """seq: (throughput per instance, batch fill, queued, ttft p99) per tick."""
    for i, (tput, fill, queued, ttft) in enumerate(seq):
        ctx = PoolSignals(now=dt * (i + 1), ready=4, throughput_per_instance=tput, ttft_p99=ttft, e2e_p99=10.0,
                          batch_fill=fill, queue_depth={"realtime": queued})
        est = update_capacity(est, ctx, CFG)
    return est


def test_saturated_ticks_measure_the_capacity_in_both_directions():
    down = feed(CapacityEstimate(1000.0, 0.0), [(600.0, 1.0, 8, 5.0)] * 60)
    assert down.tokens_per_s == pytest.approx(600.0, rel=0.01)
    assert down.saturated_ticks == 60
    up = feed(CapacityEstimate(400.0, 0.0), [(600.0, 0.95, 3, 5.0)] * 60)
    assert up.tokens_per_s == pytest.approx(600.0, rel=0.01)


def test_full_batches_without_a_queue_measure_throughput_per_seat():
    est = feed(CapacityEstimate(1000.0, 0.0), [(720.0, 0.9, 0, 1.0)] * 60)
    assert est.tokens_per_s == pytest.approx(800.0, rel=0.01)
    assert est.saturated_ticks == 0


def test_one_saturated_tick_moves_the_estimate_only_a_little():
    est = feed(CapacityEstimate(1000.0, 0.0), [(500.0, 1.0, 5, 5.0)])
    assert 800.0 < est.tokens_per_s < 1000.0


@pytest.mark.parametrize("seq", [
    [(200.0, 0.3, 0, 9.0)] * 100,  # slow p99 on a half-empty pool: a long prompt, not capacity
    [(1600.0, 0.45, 0, 1.5), (700.0, 0.45, 0, 1.5)] * 50,  # noisy light-load samples
    [(100.0, 0.1, 0, 0.2)] * 100,
])
def test_light_load_says_nothing_about_capacity(seq):
    assert feed(CapacityEstimate(1000.0, 0.0), seq).tokens_per_s == 1000.0


def test_no_ready_instance_or_no_throughput_means_no_update():
    est = CapacityEstimate(1000.0, 0.0)
    ctx = PoolSignals(now=10.0, ready=0, throughput_per_instance=50.0, batch_fill=1.0, queue_depth={"rt": 9})
    assert update_capacity(est, ctx, CFG).tokens_per_s == 1000.0
