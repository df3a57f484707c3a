import numpy as np
import pytest

from llmserve.sim.traces import LengthDist, build_trace, bursty, diurnal, from_csv, ramp


def test_diurnal_has_the_requested_peak_to_trough_and_a_day():
    tr = diurnal(peak_rps=5.0, ratio=10.0, noise=0.0, seed=1)
    assert tr.duration_s == 86400.0
    assert tr.rate_rps.max() / tr.rate_rps.min() == pytest.approx(10.0, rel=0.01)
    assert tr.rate_t[np.argmax(tr.rate_rps)] / 3600 == pytest.approx(14.0, abs=0.05)
    # Poisson counts follow the curve: the busiest hour has ~10x the quietest.
    counts = np.histogram(tr.arrival_s, bins=24, range=(0, 86400))[0]
    assert 6 < counts.max() / counts.min() < 12
    assert len(tr) == pytest.approx(np.sum(tr.rate_rps * 60.0), rel=0.02)


def test_seeded_traces_are_reproducible_and_seeds_differ():
    a, b, c = diurnal(seed=3), diurnal(seed=3), diurnal(seed=4)
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    np.testing.assert_array_equal(a.output_tokens, b.output_tokens)
    assert len(a) != len(c) or not np.array_equal(a.arrival_s, c.arrival_s)


def test_noise_moves_the_rate_but_keeps_its_mean():
    quiet, noisy = diurnal(noise=0.0, seed=2), diurnal(noise=0.2, seed=2)
    assert not np.allclose(quiet.rate_rps, noisy.rate_rps)
    assert noisy.rate_rps.mean() == pytest.approx(quiet.rate_rps.mean(), rel=0.1)


def test_bursty_has_flash_crowds_and_ramp_goes_up_and_down():
    b = bursty(base_rps=2.0, burst_factor=5.0, bursts_per_hour=2.0, noise=0.0, seed=1)
    assert b.rate_rps.max() > 4 * 2.0 and np.median(b.rate_rps) == pytest.approx(2.0, rel=0.2)
    r = ramp(low_rps=1.0, high_rps=4.0, hold_s=100, ramp_s=200, step_s=10.0)
    assert r.duration_s == 700 and r.rate_rps[0] == 1.0 and r.rate_rps.max() == 4.0 and r.rate_rps[-1] == 1.0


def test_lengths_are_clipped_and_positive():
    d = LengthDist(median=100, sigma=2.0, lo=5, hi=300)
    x = d.sample(np.random.default_rng(0), 10_000)
    assert x.min() == 5 and x.max() == 300


def test_csv_round_trip_and_errors(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("timestamp,prompt_tokens,output_tokens,priority\n"
                    "1000.5,10,20,realtime\n1000.0,5,7,batch\n1003.0,1,1,2\n")
    tr = from_csv(path)
    np.testing.assert_allclose(tr.arrival_s, [0.0, 0.5, 3.0])
    assert tr.prompt_tokens.tolist() == [5, 10, 1] and tr.priority.tolist() == [1, 0, 1]
    assert build_trace(str(path)).prompt_tokens.tolist() == [5, 10, 1]
    bad = tmp_path / "bad.csv"
    bad.write_text("time,prompt\n1,2\n")
    with pytest.raises(ValueError):
        from_csv(bad)
    with pytest.raises(ValueError):
        build_trace("weekly")


def test_window_shifts_to_zero():
    tr = ramp(seed=0)
    w = tr.window(600.0, 1200.0)
    assert w.duration_s == 600.0 and w.arrival_s.min() >= 0 and w.arrival_s.max() < 600.0
    assert len(w) == np.sum((tr.arrival_s >= 600) & (tr.arrival_s < 1200))
