from llmserve.autoscale.config import KPAConfig, SLOConfig, ThresholdConfig
from llmserve.autoscale.kpa import KPAPolicy
from llmserve.autoscale.signals import PoolSignals
from llmserve.autoscale.threshold import ThresholdPolicy

THR = ThresholdPolicy(ThresholdConfig(), SLOConfig(ttft_s=2.0))


def test_threshold_proportional_outside_the_band_and_holds_inside():
    assert THR.decide(PoolSignals(now=1, ready=4, batch_fill=0.9), None).desired == 6
    assert THR.decide(PoolSignals(now=1, ready=4, batch_fill=0.6), None).desired == 4
    assert THR.decide(PoolSignals(now=1, ready=4, batch_fill=0.15), None).desired == 1


def test_threshold_latency_adds_only_when_nothing_is_coming():
    hot = dict(now=1, ready=4, batch_fill=0.6, ttft_p99=5.0)
    assert THR.decide(PoolSignals(**hot), None).desired == 5
    assert THR.decide(PoolSignals(**hot, warming=1), None).desired == 5  # the coming one counts
    queued = dict(now=1, ready=2, batch_fill=0.6, queue_depth={"realtime": 9})
    assert THR.decide(PoolSignals(**queued), None).desired == 3


def test_threshold_does_not_scale_down_with_a_queue():
    d = THR.decide(PoolSignals(now=1, ready=4, batch_fill=0.1, queue_depth={"realtime": 1}), None)
    assert d.desired == 4
    # batch lines waiting for idle seats are not a reason to keep instances (issue 33)
    d = THR.decide(PoolSignals(now=1, ready=4, batch_fill=0.1, queue_depth={"batch": 1}), None)
    assert d.desired == 1


def test_kpa_stable_window_averages_concurrency():
    kpa = KPAPolicy(KPAConfig(target_concurrency=10.0))
    state = kpa.initial_state()
    for t in range(0, 120, 2):
        d = kpa.decide(PoolSignals(now=t, ready=3, running=25 if t % 4 else 35), state)
        state = d.state
    assert d.desired == 3  # mean 30 / 10
    assert state.panic_since is None
    assert len(state.samples) == 30  # only the stable window is kept


def test_predictive_backlog_floor_counts_coming_capacity_but_not_the_forecast():
    from llmserve.autoscale.config import PredictiveConfig
    from llmserve.autoscale.predictive import PredictivePolicy

    policy = PredictivePolicy(PredictiveConfig(capacity_tokens_per_s=1000.0), SLOConfig())
    # The forecast says one instance; 32 running in 4 full instances of 8 seats and 20 queued need 7.
    ctx = PoolSignals(now=10.0, arrival_tokens_per_s=100.0, ready=4, warming=2, running=32, batch_fill=1.0,
                      seats_per_instance=8.0, queue_depth={"realtime": 20})
    d = policy.decide(ctx, policy.initial_state())
    assert d.desired == 7 and d.reason.startswith("backlog")
    calm = PoolSignals(now=10.0, arrival_tokens_per_s=100.0, ready=4, running=8, batch_fill=0.25,
                       seats_per_instance=8.0)
    assert policy.decide(calm, policy.initial_state()).desired == 1
    # Two of four ready instances have reported yet (16 running, full): seats per
    # instance still come from the reports, so 16 + 20 queued need 5, not 9.
    partial = PoolSignals(now=10.0, arrival_tokens_per_s=100.0, ready=4, running=16, batch_fill=1.0,
                          seats_per_instance=8.0, queue_depth={"realtime": 20})
    assert policy.decide(partial, policy.initial_state()).desired == 5
