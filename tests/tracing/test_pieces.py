"""The small parts: settings, Server-Timing, the engine's span records, the wire."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llmserve.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from llmserve.engine.request import Request
from llmserve.engine.sampling_params import SamplingParams
from llmserve.engine.trace_spans import parse_traceparent, request_spans
from llmserve.engine.wire import decode_output, decode_request, encode_output, encode_request
from llmserve.server.config import ServerConfig
from llmserve.tracing.config import TracingConfig
from llmserve.tracing.timing import parse_server_timing, server_timing

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_the_flag_wins_over_the_environment_and_urls_are_checked():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert TracingConfig.resolve(None, env, "s").traces_url == "http://collector:4318/v1/traces"
    assert TracingConfig.resolve("http://other:4318/", env, "s").otlp_endpoint == "http://other:4318"
    assert TracingConfig.resolve("http://c:4318/v1/traces", {}, "s").traces_url == "http://c:4318/v1/traces"
    assert not TracingConfig.resolve(None, {}, "s").enabled
    with pytest.raises(ValidationError, match="http"):
        TracingConfig(otlp_endpoint="collector:4318")
    with pytest.raises(ValidationError):
        ServerConfig(otlp_endpoint="grpc://collector:4317")


def test_server_timing_round_trips():
    value = server_timing([("admission", 1.234, None), ("attempts", None, "2"), ("decode", 310.0, None)])
    assert value == 'admission;dur=1.2, attempts;desc="2", decode;dur=310.0'
    assert parse_server_timing(value + ', cache;desc="hit";dur=2') == {"admission": 1.2, "attempts": "2",
                                                                       "decode": 310.0, "cache": 2.0}


def test_only_a_sampled_well_formed_traceparent_is_traced():
    assert parse_traceparent(TP) == ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
    assert parse_traceparent(TP[:-2] + "00") is None  # not sampled
    assert parse_traceparent("00-xyz-b7ad6b7169203331-01") is None
    assert parse_traceparent("garbage") is None


def _request(trace: str | None) -> Request:
    r = Request("r-0-0", [1, 2, 3], SamplingParams(max_tokens=4), 4, arrival_time=100.0, trace=trace)
    r.all_token_ids += [7, 8]
    return r


def test_a_finished_request_is_four_spans_under_the_callers_span_in_order():
    m = RequestMetrics(100.0, first_scheduled_time=100.01, first_token_time=100.05, finished_time=100.25)
    recs = request_spans(_request(TP), "length", m)
    names = [r[0] for r in recs]
    assert names == ["engine.request", "engine.queue", "engine.prefill", "engine.decode"]
    root = recs[0]
    assert root[1] == TP.split("-")[1] and root[3] == TP.split("-")[2]  # the caller's trace and span
    assert {r[3] for r in recs[1:]} == {root[2]} and len({r[2] for r in recs}) == 4
    ms = [(r[5] - r[4]) / 1e6 for r in recs]
    assert ms == pytest.approx([250, 10, 40, 200], abs=0.01)
    assert recs[1][4] == root[4] and recs[3][5] == root[5]
    assert root[6]["gen_ai.usage.input_tokens"] == 3 and root[6]["gen_ai.usage.output_tokens"] == 2
    assert root[6]["gen_ai.response.finish_reasons"] == ["length"]


def test_a_request_aborted_in_the_queue_has_only_its_queue_phase_and_an_untraced_one_none():
    m = RequestMetrics(100.0, finished_time=100.5)
    assert [r[0] for r in request_spans(_request(TP), "abort", m)] == ["engine.request", "engine.queue"]
    assert request_spans(_request(None), "length", m) is None


def test_the_traceparent_and_the_span_records_cross_the_wire_as_plain_data():
    req, _ = decode_request(encode_request(_request(TP), None))
    assert req.trace == TP
    out = RequestOutput("r-0-0", [1, 2, 3], [CompletionOutput(0, "ab", [7, 8], "length")], True,
                        metrics=RequestMetrics(100.0), spans=[["engine.request", "a" * 32, "b" * 16, "c" * 16, 1, 2, {}, 9]])
    back = decode_output(encode_output(out), [1, 2, 3], None)
    assert back.spans == out.spans
