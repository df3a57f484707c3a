import pytest

from llmserve.autoscale.saturation import SATURATED_FILL, CapacityEstimate, update_capacity
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


def test_a_realtime_queue_behind_batch_lines_is_not_saturation():
    """Batch lines hold seats there: the instances are not at their throughput (read so, the
    simulated day's estimate fell ~8 % and stayed low)."""
    def tick(batch_dispatched):
        ctx = PoolSignals(now=10.0, ready=4, throughput_per_instance=500.0, batch_fill=SATURATED_FILL,
                          queue_depth={"realtime": 8}, batch_dispatched=batch_dispatched)
        return update_capacity(CapacityEstimate(1000.0, 0.0), ctx, CFG.model_copy(update={"capacity_measure_fill": 0.95}))

    assert tick(6).tokens_per_s == 1000.0 and tick(6).saturated_ticks == 0
    assert tick(0).tokens_per_s < 1000.0 and tick(0).saturated_ticks == 1


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


# ---- capacity from the instances' own step models (issue 28) ---------------------------------

def test_modelled_capacity_is_a_full_batch_of_the_mean_request():
    from llmserve.autoscale.saturation import modelled_capacity

    # 100-token prompts at 1 ms a token, 100 output tokens at 3 ms a row plus 8 ms / 64 seats:
    # 0.1 + 100 * 0.003125 = 0.4125 s of instance time per 200 tokens.
    assert modelled_capacity(0.008, 0.001, 0.003, 64, 100, 100) == pytest.approx(200 / 0.4125)
    # Twice as slow steps (one core instead of two): half the capacity.
    assert modelled_capacity(0.016, 0.002, 0.006, 64, 100, 100) == pytest.approx(100 / 0.4125)
    assert modelled_capacity(0.008, 0.001, 0.003, 0, 100, 100) == 0.0


def _modelled(est, value, n=1, cfg=CFG, fill=0.2):
    for i in range(n):
        ctx = PoolSignals(now=(est.t or 0.0) + 10.0, ready=1, throughput_per_instance=50.0, batch_fill=fill,
                          modelled_capacity=value)
        est = update_capacity(est, ctx, cfg)
    return est


def test_the_first_step_model_replaces_the_prior_at_any_fill_and_later_ones_move_it():
    est = _modelled(CapacityEstimate(1000.0, 0.0), 240.0)
    assert est.tokens_per_s == 240.0 and est.measured  # no constant outlives the first report
    later = _modelled(est, 480.0)
    assert 240.0 < later.tokens_per_s < 480.0  # then the EWMA, like every other measurement
    assert _modelled(est, 480.0, n=60).tokens_per_s == pytest.approx(480.0, rel=0.01)


def test_capacity_from_model_off_keeps_the_prior():
    off = CFG.model_copy(update={"capacity_from_model": False})
    assert _modelled(CapacityEstimate(1000.0, 0.0), 240.0, n=10, cfg=off).tokens_per_s == 1000.0


def test_the_collector_turns_reported_step_models_into_capacity():
    from llmserve.autoscale.saturation import modelled_capacity
    from llmserve.autoscale.collector import SignalCollector
    from llmserve.lifecycle import InstanceState
    from llmserve.load_report import LoadReport

    def report(costs):
        return LoadReport(instance_id="a", model="m", ready=True, draining=False, num_running=1, num_waiting=0,
                          num_waiting_by_priority={}, kv_cache_usage=0.0, busy_fraction=0.1, tokens_per_s=10.0,
                          generation_tokens_per_s=5.0, max_num_seqs=16, prefix_cache_hit_rate=0.0, timestamp=0.0,
                          step_costs=costs)

    col = SignalCollector(output_tokens_prior=64.0)
    col.record_arrival(0.5, 32)
    fast = {"base_s": 0.01, "prefill_token_s": 0.001, "decode_seq_s": 0.004}
    ctx = col.snapshot(1.0, [report(fast), report(None)], {}, {InstanceState.READY: 2})
    assert ctx.modelled_capacity == pytest.approx(modelled_capacity(0.01, 0.001, 0.004, 16, 32, 64))
    assert col.snapshot(2.0, [report(None)], {}, {InstanceState.READY: 1}).modelled_capacity == 0.0
