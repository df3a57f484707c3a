import pytest

from llmserve.gateway.window_stats import VersionStats, WindowStats, percentile


def test_percentile_is_nearest_rank():
    xs = [float(i) for i in range(1, 101)]
    assert percentile(xs, 50) == 50.0
    assert percentile(xs, 99) == 99.0
    assert percentile(xs, 100) == 100.0
    assert percentile(xs, 0) == 1.0
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0


def test_snapshot_counts_errors_and_latencies_in_window():
    w = WindowStats(window_s=10)
    for k in range(10):
        w.record("v1", now=float(k), ok=True, ttft_s=0.01 * (k + 1), e2e_s=1.0 + k)
    w.record("v1", now=9.5, ok=False)  # an error with no token: no latency sample
    s = w.snapshot("v1", now=9.5)
    assert (s.requests, s.errors) == (11, 1)
    assert s.error_rate == pytest.approx(1 / 11)
    assert s.ttft_p99 == pytest.approx(0.10)
    assert s.e2e_p50 == 5.0


def test_old_samples_leave_the_window():
    w = WindowStats(window_s=10)
    w.record("v1", now=0.0, ok=False)
    w.record("v1", now=5.0, ok=True, ttft_s=0.1, e2e_s=0.2)
    assert w.snapshot("v1", now=10.0).requests == 2
    s = w.snapshot("v1", now=10.5)
    assert (s.requests, s.errors) == (1, 0)
    assert w.snapshot("v1", now=100.0) == VersionStats()
    assert w.snapshot("never-seen", now=1.0) == VersionStats()


def test_sample_cap_keeps_the_newest():
    w = WindowStats(window_s=100, max_samples=5)
    for k in range(10):
        w.record("v", now=float(k), ok=k >= 5)
    s = w.snapshot("v", now=10.0)
    assert (s.requests, s.errors) == (5, 0)
