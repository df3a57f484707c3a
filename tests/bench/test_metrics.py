"""Metric definitions on hand-built records with known timings (no server, no clock)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmserve.bench import metrics
from llmserve.bench.metrics import SLO, LatencyStats, percentile_key, summarize, summarize_by_priority
from llmserve.bench.records import ErrorKind, OutputCountSource, RequestRecord


def ok(index, chunks, out_tokens, start=0.0, prompt_len=10, priority="default", usage_prompt=None):
    return RequestRecord(
        index, priority, prompt_len, out_tokens, scheduled_s=start, start_s=start, chunk_s=list(chunks),
        success=True, output_tokens=out_tokens, output_source=OutputCountSource.USAGE,
        usage_prompt_tokens=usage_prompt,
    )


def failed(index, kind, status=None, priority="default"):
    return RequestRecord(index, priority, 10, 5, 0.0, error_kind=kind, http_status=status, error="x")


def test_ttft_tpot_itl_e2el_follow_their_definitions():
    # chunks at 100, 150, 250, 300 ms; the server packed 5 tokens into 4 chunks
    r = ok(0, [0.100, 0.150, 0.250, 0.300], out_tokens=5)
    assert metrics.ttft(r) == pytest.approx(0.100)
    assert metrics.e2el(r) == pytest.approx(0.300)
    assert metrics.itls(r) == pytest.approx([0.050, 0.100, 0.050])
    # TPOT divides by output tokens - 1, not by the number of gaps
    assert metrics.tpot(r) == pytest.approx((0.300 - 0.100) / 4)


def test_tpot_is_undefined_for_a_single_token():
    r = ok(0, [0.2], out_tokens=1)
    assert metrics.tpot(r) is None
    s = summarize([r], duration_s=1.0)
    assert s.tpot.count == 0 and s.tpot.mean_ms is None
    assert s.ttft.mean_ms == pytest.approx(200.0)
    assert s.itl.count == 0


def test_summary_pools_itls_and_excludes_failures():
    recs = [
        ok(0, [0.1, 0.2, 0.4], 3, prompt_len=7, usage_prompt=8),
        ok(1, [0.3, 0.31], 2, start=0.5, prompt_len=11, usage_prompt=12),
        failed(2, ErrorKind.HTTP_STATUS, 503),
        failed(3, ErrorKind.HTTP_STATUS, 503),
        failed(4, ErrorKind.CONNECTION),
        failed(5, ErrorKind.TIMEOUT),
    ]
    s = summarize(recs, duration_s=2.0)
    assert (s.num_requests, s.completed, s.failed) == (6, 2, 4)
    assert s.failures_by_kind == {"connection": 1, "http_503": 2, "timeout": 1}
    assert s.total_input_tokens == 18 and s.server_prompt_tokens == 20
    assert s.total_output_tokens == 5
    assert s.request_throughput == pytest.approx(1.0)
    assert s.output_throughput == pytest.approx(2.5)
    assert s.total_token_throughput == pytest.approx((18 + 5) / 2.0)
    assert s.itl.count == 3
    assert s.itl.mean_ms == pytest.approx((100 + 200 + 10) / 3)
    assert s.tpot.mean_ms == pytest.approx(((0.4 - 0.1) / 2 + (0.31 - 0.3) / 1) / 2 * 1000)
    assert s.e2el.median_ms == pytest.approx(355.0)  # numpy's median of (310, 400), as vLLM


def test_percentiles_on_known_data():
    st = LatencyStats.of([x / 10 for x in range(1, 11)], percentiles=(90, 99, 99.9))
    assert st.mean_ms == pytest.approx(550.0)
    # numpy's linear interpolation over 100..1000 ms, as vllm bench serve reports them.
    assert st.median_ms == pytest.approx(550.0)
    assert st.percentiles_ms["p90"] == pytest.approx(910.0)
    assert st.percentiles_ms["p99"] == pytest.approx(991.0)
    assert st.percentiles_ms["p99.9"] == pytest.approx(999.1)
    assert st.std_ms == pytest.approx(float(np.std(np.arange(100, 1001, 100))))


@pytest.mark.parametrize("seed", range(5))
def test_percentiles_and_median_are_numpys_as_vllms(seed):
    rng = np.random.default_rng(seed)
    seconds = rng.lognormal(-2, 1, int(rng.integers(1, 200)))
    st = LatencyStats.of(seconds, percentiles=(25, 50, 90, 95, 99, 99.9))
    ms = seconds * 1000.0
    assert st.median_ms == pytest.approx(float(np.median(ms)), rel=1e-12)
    for p in (25, 50, 90, 95, 99, 99.9):
        assert st.percentiles_ms[percentile_key(p)] == pytest.approx(float(np.percentile(ms, p)), rel=1e-12)


def test_goodput_counts_requests_meeting_every_slo():
    # TTFTs 100..1000 ms; e2e = TTFT + 90 ms over 10 tokens -> TPOT 10 ms each
    recs = [ok(i, [t, t + 0.09], 10) for i, t in enumerate(x / 10 for x in range(1, 11))]
    recs.append(ok(10, [0.05], 1))  # one token: TPOT counts as 0 for goodput
    recs.append(failed(11, ErrorKind.TIMEOUT))
    s = summarize(recs, 2.0, slo=SLO.parse(["ttft:500"]))
    assert s.good_completed == 6 and s.request_goodput == pytest.approx(3.0)
    s = summarize(recs, 2.0, slo=SLO.parse(["ttft:500", "tpot:9"]))
    assert s.good_completed == 1  # only the one-token request passes tpot:9
    s = summarize(recs, 2.0, slo=SLO.parse(["e2el:300"]))
    assert s.good_completed == 3  # e2e 190, 290 ms and the 50 ms one
    assert summarize(recs, 2.0).request_goodput is None


def test_slo_parsing_rejects_bad_input():
    assert SLO.parse(["TTFT:200", "e2el:1e4"]).to_dict() == {"ttft": 200.0, "e2el": 10000.0}
    for bad in (["ttft"], ["itl:5"], ["ttft:fast"], ["tpot:-1"], ["tpot:inf"]):
        with pytest.raises(ValueError):
            SLO.parse(bad)


def test_per_priority_classes_are_separate():
    recs = [ok(0, [0.1, 0.2], 2), ok(1, [1.0, 2.0], 2, priority="batch"), failed(2, ErrorKind.STREAM, priority="batch")]
    by = summarize_by_priority(recs, 4.0)
    assert set(by) == {"batch", "default"}
    assert by["default"].ttft.mean_ms == pytest.approx(100.0)
    assert by["batch"].ttft.mean_ms == pytest.approx(1000.0)
    assert (by["batch"].completed, by["batch"].failures_by_kind) == (1, {"stream": 1})
    assert by["batch"].duration_s == 4.0


def test_peaks_and_timeline():
    # two requests overlapping in second 0; 3 chunks in bucket 0, 1 in bucket 1
    recs = [ok(0, [0.1, 0.2, 1.5], 3, start=0.0), ok(1, [0.3], 1, start=0.5)]
    s = summarize(recs, 2.0)
    assert s.max_output_tokens_per_s == 3.0 and s.max_concurrent_requests == 2
    t, tok_s, req_s = metrics.throughput_timeline(recs, bucket_s=1.0)
    assert t.tolist() == [0.0, 1.0]
    assert tok_s.tolist() == pytest.approx([3.0, 1.0])
    assert req_s.tolist() == [1.0, 1.0]


def test_max_in_flight_is_exact():
    # three back-to-back requests within one second, then two overlapping ones
    recs = [ok(0, [0.1, 0.2], 2, start=0.0), ok(1, [0.1, 0.2], 2, start=0.2), ok(2, [0.1, 0.2], 2, start=0.4),
            ok(3, [0.5, 1.0], 2, start=2.0), ok(4, [0.5, 1.0], 2, start=2.5)]
    s = summarize(recs, 4.0)
    assert s.max_in_flight == 2
    assert s.max_concurrent_requests == 3  # vLLM's bucketed count sees 3 in second 0


def test_flat_dict_uses_vllm_key_names():
    d = summarize([ok(0, [0.1, 0.2], 2)], 1.0, percentiles=(99,)).to_flat_dict()
    for key in ("completed", "total_input_tokens", "total_output_tokens", "request_throughput",
                "output_throughput", "total_token_throughput", "mean_ttft_ms", "median_tpot_ms",
                "p99_itl_ms", "std_e2el_ms", "max_output_tokens_per_s", "max_concurrent_requests"):
        assert key in d
    assert not any(isinstance(v, float) and math.isnan(v) for v in d.values())
