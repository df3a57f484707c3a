import math

import pytest

from llmserve.autoscale.forecast import (
    SeasonalProfile,
    holt_forecast,
    holt_update,
    seasonal_delta,
    seasonal_update,
)


def test_holt_recovers_a_linear_series():
    state = None
    for i in range(600):
        t = 2.0 * i
        state = holt_update(state, t, 100.0 + 0.5 * t, level_tau_s=30.0, trend_tau_s=120.0)
    t_last = 2.0 * 599
    assert state.trend == pytest.approx(0.5, rel=1e-3)
    assert state.level == pytest.approx(100.0 + 0.5 * t_last, rel=1e-4)
    assert holt_forecast(state, 150.0) == pytest.approx(100.0 + 0.5 * (t_last + 150.0), rel=1e-3)


def test_holt_does_not_depend_on_tick_size_for_a_line():
    def fit(dt):
        state = None
        for i in range(int(2000 / dt) + 1):
            state = holt_update(state, i * dt, 3.0 * i * dt, 60.0, 300.0)
        return state

    a, b = fit(1.0), fit(5.0)
    assert a.trend == pytest.approx(b.trend, rel=0.02)
    assert a.trend == pytest.approx(3.0, rel=0.01)


def test_holt_first_observation_and_time_going_backwards():
    s = holt_update(None, 10.0, 42.0, 60.0, 600.0)
    assert (s.level, s.trend) == (42.0, 0.0)
    assert holt_update(s, 5.0, 1000.0, 60.0, 600.0) is s


def test_holt_flat_noise_has_small_trend():
    import random

    rng = random.Random(1)
    state = None
    for i in range(3000):
        state = holt_update(state, 2.0 * i, 1000.0 + rng.gauss(0, 100), 60.0, 600.0)
    assert abs(holt_forecast(state, 150.0) - 1000.0) < 60.0


def _daily(t):
    return 1000.0 + 900.0 * math.sin(2 * math.pi * t / 86400.0)


def test_seasonal_profile_learns_a_day_and_predicts_the_next():
    profile = SeasonalProfile.empty(86400.0, 288)
    t = 0.0
    while t < 86400.0 + 120.0:
        profile = seasonal_update(profile, t, _daily(t), tau_periods=1.0)
        t += 60.0
    assert profile.complete
    # Morning rise on day two: the profile knows it is coming.
    now, h = 86400.0 + 3600.0, 1800.0
    expected = _daily(now + h) - _daily(now)
    assert seasonal_delta(profile, now, h) == pytest.approx(expected, abs=25.0)


def test_seasonal_profile_incomplete_gives_none():
    profile = SeasonalProfile.empty(86400.0, 24)
    profile = seasonal_update(profile, 10.0, 5.0, 1.0)
    assert not profile.complete
    assert seasonal_delta(profile, 10.0, 100.0) is None
