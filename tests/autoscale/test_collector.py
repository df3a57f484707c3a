from dataclasses import dataclass

import pytest

from llmserve.autoscale.collector import SignalCollector
from llmserve.percentiles import percentile
from llmserve.lifecycle import InstanceState as S


@dataclass
class Load:
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    busy_fraction: float
    tokens_per_s: float
    max_num_seqs: int = 8


def test_percentile_nearest_rank():
    values = list(range(1, 101))
    assert percentile(values, 99) == 99
    assert percentile(values, 50) == 50
    assert percentile([], 99) is None


def test_snapshot_rates_windows_and_means():
    c = SignalCollector(window_s=10.0, latency_window_s=30.0, output_tokens_prior=100.0)
    for i in range(41):
        c.record_arrival(float(i), 50)
    c.record_first_token(5.0, 9.0)  # outside the latency window at t=40
    for i in range(20, 40):
        c.record_first_token(float(i), 0.1 * (i - 19))
    s = c.snapshot(40.0, [Load(4, 1, 0.5, 1.0, 300.0), Load(2, 0, 0.1, 0.5, 100.0)],
                   {"realtime": 3, "batch": 2}, {S.READY: 2, S.WARMING: 1, S.DRAINING: 1})
    assert s.arrival_rate == pytest.approx(1.0)  # arrivals at 31..40 (window is (30, 40])
    assert s.arrival_tokens_per_s == pytest.approx(150.0)
    assert s.ttft_p99 == pytest.approx(2.0) and s.ttft_p50 == pytest.approx(1.0)
    assert s.e2e_p99 is None
    assert (s.running, s.waiting, s.queued) == (6, 1, 5)
    assert s.batch_fill == pytest.approx((4 / 8 + 2 / 8) / 2)
    assert s.seats_per_instance == pytest.approx(8.0)
    assert s.throughput_per_instance == pytest.approx(200.0)
    assert (s.ready, s.warming, s.starting, s.draining, s.provisioned) == (2, 1, 0, 1, 3)


def test_mean_output_tokens_tracks_finished_requests():
    c = SignalCollector(output_tokens_prior=100.0, output_tokens_tau=10)
    for _ in range(200):
        c.record_finish(1.0, 2.0, 300)
    assert c.mean_output_tokens == pytest.approx(300.0, rel=0.01)


def test_the_output_prior_only_lasts_until_the_first_finish():
    c = SignalCollector(output_tokens_prior=100.0, output_tokens_tau=200)
    c.record_finish(1.0, 2.0, 500)
    assert c.mean_output_tokens == 500.0
    c.record_finish(1.0, 2.0, 300)
    assert c.mean_output_tokens == 400.0


def test_batch_arrivals_are_counted_apart_and_their_latency_is_not_the_slos():
    """Issue 33: the policies see realtime demand plus what the batch windows need."""
    c = SignalCollector(window_s=10.0, output_tokens_prior=100.0, start=0.0)
    for k in range(10):
        c.record_arrival(1.0 + k * 0.5, 100)  # realtime
    for k in range(30):
        c.record_arrival(1.0 + k * 0.1, 100, batch=True)
    c.record_first_token(5.0, 0.2)
    c.record_first_token(5.0, 40.0, batch=True)  # a batch line waits for idle seats: not an SLO miss
    c.record_finish(5.0, 1.0, 100)
    c.record_finish(5.0, 90.0, 100, batch=True)
    c.set_batch_need(0.5)
    s = c.snapshot(10.0, [], {"realtime": 1, "batch": 7}, {S.READY: 1}, dispatched=6, batch_dispatched=4)
    assert s.arrival_rate == pytest.approx(4.0) and s.batch_arrival_rate == pytest.approx(3.0)
    assert s.realtime_tokens_per_s == pytest.approx(10 * 200 / 10.0)
    assert s.batch_need_tokens_per_s == pytest.approx(0.5 * 200)  # priced at the mean request
    assert s.ttft_p99 == pytest.approx(0.2) and s.e2e_p99 == pytest.approx(1.0)
    assert s.realtime_queued == 1 and s.realtime_in_flight == 8 + 6 - 7 - 4
    c.set_batch_need(0.0)
    assert c.snapshot(11.0, [], {}, {}).batch_need_tokens_per_s == 0.0
