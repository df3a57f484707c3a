"""What live runs showed the policies missing: KPA's target on small instances, the
pool's true in-flight count, and forecasts that hold on to load that stopped."""

from llmserve.autoscale import KPAConfig, PoolSignals, PredictiveConfig, SLOConfig
from llmserve.autoscale.kpa import KPAPolicy
from llmserve.autoscale.predictive import PredictivePolicy


def test_kpa_target_is_a_share_of_the_seats_instances_report():
    policy = KPAPolicy(KPAConfig())
    busy = PoolSignals(now=0.0, running=2, queue_depth={"realtime": 10}, ready=1, seats_per_instance=2)
    d = policy.decide(busy, policy.initial_state())
    assert policy.target(busy) == 0.7 * 2
    assert d.desired == 9  # ceil(12 / 1.4): every request a seat at 70 %
    # A configured target wins; with no report yet the default seat count stands in.
    assert KPAPolicy(KPAConfig(target_concurrency=4)).target(busy) == 4
    assert policy.target(PoolSignals(now=0.0)) == 0.7 * 16


def test_in_flight_counts_what_the_gateway_has_sent_when_reports_lag():
    # Reports a poll old say 2 running; the gateway has 7 out and 3 queued.
    ctx = PoolSignals(now=0.0, running=2, dispatched=7, queue_depth={"realtime": 3})
    assert ctx.in_flight == 10
    assert PoolSignals(now=0.0, running=5, waiting=4, dispatched=7).in_flight == 9


def _forecasts(policy, arrivals, t_end, dt=1.0):
    state, out, t = policy.initial_state(), [], 0.0
    while t <= t_end:
        d = policy.decide(PoolSignals(now=t, arrival_tokens_per_s=arrivals(t), ready=3,
                                      seats_per_instance=16), state)
        state = d.state
        out.append((t, policy.forecast(state, t)[0], d.desired))
        t += dt
    return out


def _ramp_then_silence(t):
    """Load that rose for five minutes, then stopped: the level has a rising trend."""
    return 500.0 + 10.0 * t if t < 300 else 0.0


def test_the_forecast_lets_go_within_a_few_ticks_when_arrivals_stop():
    policy = PredictivePolicy(PredictiveConfig(capacity_tokens_per_s=1000.0, lead_time_s=30), SLOConfig())
    out = _forecasts(policy, _ramp_then_silence, 500)
    assert max(n for t, _, n in out if t < 300) >= 3
    assert all(f < 100 for t, f, _ in out if t >= 340)
    assert all(n <= 1 for t, _, n in out if t >= 340)


def test_the_forecast_still_smooths_noise_and_follows_rises():
    policy = PredictivePolicy(PredictiveConfig(capacity_tokens_per_s=1000.0), SLOConfig())
    wobble = _forecasts(policy, lambda t: 3000.0 * (1.3 if int(t) % 20 < 10 else 0.7), 900)
    assert all(2000 < f < 4500 for t, f, _ in wobble if t > 300)
    rise = _forecasts(policy, lambda t: 1000.0 if t < 300 else 4000.0, 500)
    assert next(f for t, f, _ in rise if t == 360) > 1500


def test_without_letting_go_the_ramp_is_held_through_the_silence():
    """What the live run showed before: the level and its rising trend outlive the load."""
    policy = PredictivePolicy(PredictiveConfig(capacity_tokens_per_s=1000.0, lead_time_s=30, let_go_ratio=0.0),
                              SLOConfig())
    out = _forecasts(policy, _ramp_then_silence, 500)
    assert all(f > 1000 for t, f, _ in out if 340 <= t <= 400)
