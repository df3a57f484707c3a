"""Arrival schedules: reproducible per seed, right mean rate, burstiness and traces."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmserve.bench.arrivals import RatePoint, invert_cumulative_rate, load_rate_trace, plan_arrivals


def test_poisson_arrivals_are_reproducible_per_seed():
    a = plan_arrivals(500, rate=8.0, seed=42)
    b = plan_arrivals(500, rate=8.0, seed=42)
    c = plan_arrivals(500, rate=8.0, seed=43)
    assert np.array_equal(a, b)
    assert not np.allclose(a, c)
    assert np.all(np.diff(a) >= 0) and a[0] > 0


def test_poisson_mean_gap_and_dispersion():
    n, rate = 20_000, 4.0
    gaps = np.diff(np.concatenate([[0.0], plan_arrivals(n, rate=rate, seed=7)]))
    # mean of n exponential gaps: sd = (1/rate)/sqrt(n); allow 5 sd
    assert abs(gaps.mean() - 1 / rate) < 5 * (1 / rate) / math.sqrt(n)
    # exponential gaps: coefficient of variation 1
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_burstiness_changes_dispersion_not_rate(burstiness):
    n, rate = 20_000, 10.0
    gaps = np.diff(np.concatenate([[0.0], plan_arrivals(n, rate=rate, burstiness=burstiness, seed=1)]))
    cv = 1 / math.sqrt(burstiness)  # gamma(shape k) has CV 1/sqrt(k)
    assert abs(gaps.mean() - 1 / rate) < 5 * cv * (1 / rate) / math.sqrt(n)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


def test_infinite_rate_sends_everything_at_once():
    assert plan_arrivals(5).tolist() == [0.0] * 5
    assert plan_arrivals(3, rate=2.0, burstiness=math.inf).tolist() == pytest.approx([0.5, 1.0, 1.5])


def test_cumulative_rate_inversion_is_exact_on_ramps_and_steps():
    ramp = [RatePoint(0, 0), RatePoint(10, 10)]  # Λ(t) = t²/2 on [0, 10], then 10/s
    t = invert_cumulative_rate(ramp, np.array([0.5, 8.0, 50.0, 60.0]))
    assert t.tolist() == pytest.approx([1.0, 4.0, 10.0, 11.0])
    down = [RatePoint(0, 10), RatePoint(10, 0)]  # area 50 then the trace ends
    t = invert_cumulative_rate(down, np.array([10.0, 50.0, 51.0]))
    assert t[0] == pytest.approx(10 - math.sqrt(80)) and t[1] == pytest.approx(10.0)
    assert math.isinf(t[2])
    step = [RatePoint(0, 1), RatePoint(5, 1), RatePoint(5, 10)]
    assert invert_cumulative_rate(step, np.array([5.0, 15.0])).tolist() == pytest.approx([5.0, 6.0])


def test_trace_follows_the_profile_and_ends_at_rate_zero(tmp_path):
    csv = tmp_path / "trace.csv"
    csv.write_text("time_s,rate\n0,2\n100,2\n100,20\n200,20\n200,0\n")
    trace = load_rate_trace(csv)
    t = plan_arrivals(100_000, trace=trace, seed=3)
    # expected 200 arrivals in the first 100 s, 2000 in the next, none after
    low, high = np.sum(t < 100), np.sum((t >= 100) & (t < 200))
    assert abs(low - 200) < 5 * math.sqrt(200)
    assert abs(high - 2000) < 5 * math.sqrt(2000)
    assert len(t) == low + high and t[-1] < 200


def test_bad_traces_are_rejected(tmp_path):
    for text in ("5,1\n", "0,1\n3,2\n2,1\n", "0,-1\n", "0,abc\n1,2\n", ""):
        p = tmp_path / "t.csv"
        p.write_text(text)
        with pytest.raises(ValueError):
            load_rate_trace(p)
    with pytest.raises(ValueError):
        plan_arrivals(3, rate=0.0)
    with pytest.raises(ValueError):
        plan_arrivals(3, rate=1.0, burstiness=0.0)
