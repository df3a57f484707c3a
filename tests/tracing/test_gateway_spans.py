"""The gateway's spans against fake upstreams: each attempt is a span whose traceparent
is the one the upstream got; a resumed stream and a retried request show two."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmserve.tracing.gateway import GatewayTelemetry
from llmserve.tracing.provider import Tracing
from llmserve.tracing.timing import parse_server_timing
from tests.gateway.app_harness import sse_events, stack
from tests.gateway.fake_upstream import Behaviour

CHAT = {"model": "chat", "stream": True, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def traced() -> tuple[GatewayTelemetry, InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    return GatewayTelemetry(Tracing("llmserve-gateway", spans, batch=False), access_log=False), spans


def names(s) -> dict[str, str]:
    """The gateway's instance ids (host:port) by fake name."""
    return {srv.url.split("//")[1]: name for name, srv in s.upstreams.items()}


def attempts_and_headers(spans, fakes) -> tuple[dict, list[dict], dict[str, str]]:
    """The root span, its attempt spans in order, and which span id each fake was sent."""
    finished = spans.get_finished_spans()
    (root,) = [s for s in finished if s.name == "chat chat"]
    attempts = sorted((s for s in finished if s.name == "gateway.attempt"), key=lambda s: s.start_time)
    assert {s.parent.span_id for s in attempts} == {root.context.span_id}
    assert {s.context.trace_id for s in finished} == {root.context.trace_id}
    sent = {h["traceparent"].split("-")[2]: b.instance_id for b in fakes for h in b.headers if "traceparent" in h}
    return root, attempts, sent


def test_a_resumed_stream_is_two_attempts_each_with_the_traceparent_its_instance_got():
    a, b = (Behaviour(n, tokens=8, break_after_tokens=3) for n in "ab")
    telemetry, spans = traced()
    with stack({"v1": [a, b]}, telemetry=telemetry) as s:
        with s.client.stream("POST", "/v1/chat/completions", json=CHAT) as r:
            events = sse_events(r.read().decode())
            timing = parse_server_timing(r.headers["server-timing"])
        ids = names(s)
    assert events[-1] == "[DONE]"
    root, attempts, sent = attempts_and_headers(spans, [a, b])
    assert len(attempts) == 2
    broken, resumed = attempts
    assert broken.status.status_code.name == "ERROR" and resumed.status.status_code.name == "UNSET"
    assert "llmserve.resumed_after_tokens" not in broken.attributes
    assert resumed.attributes["llmserve.resumed_after_tokens"] == 3
    assert [a.attributes["llmserve.attempt"] for a in attempts] == [1, 2]
    assert broken.end_time <= resumed.start_time
    by_span = {f"{x.context.span_id:016x}": ids[x.attributes["llmserve.instance"]] for x in attempts}
    assert by_span == sent and sorted(sent.values()) == ["a", "b"]  # each got its own attempt's context
    assert root.attributes["llmserve.resumes"] == 1 and root.attributes["llmserve.attempts"] == 2
    assert root.attributes["gen_ai.usage.output_tokens"] == len(events) - 1  # the chunks it relayed
    assert timing["trace"] == f"{root.context.trace_id:032x}"


def test_a_request_retried_after_a_500_is_two_attempts_the_first_failed():
    bad, good = Behaviour("bad", error_rate=1.0), Behaviour("good")
    telemetry, spans = traced()
    with stack({"v1": [bad, good]}, telemetry=telemetry, retry={"max_attempts": 3}) as s:
        ok = None
        for _ in range(10):  # until one lands on the bad instance first
            spans.clear()
            r = s.chat("hi")
            assert r.status_code == 200
            if bad.requests:
                ok = r
                break
        ids = names(s)
    assert ok is not None
    root, attempts, _ = attempts_and_headers(spans, [bad, good])
    assert [ids[x.attributes["llmserve.instance"]] for x in attempts] == ["bad", "good"]
    assert attempts[-2].status.status_code.name == "ERROR"
    assert parse_server_timing(ok.headers["server-timing"])["attempts"] == str(len(attempts))


def test_with_tracing_off_the_clients_traceparent_is_passed_on_and_timings_still_sent():
    a = Behaviour("a")
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with stack({"v1": [a]}) as s:
        r = s.chat("hi", headers={"traceparent": tp})
    assert r.status_code == 200 and a.headers[-1]["traceparent"] == tp
    timing = parse_server_timing(r.headers["server-timing"])
    assert timing["attempts"] == "1" and "admission" in timing and "trace" not in timing


def test_an_unsampled_trace_is_recorded_nowhere_and_says_so_to_the_instance():
    spans = InMemorySpanExporter()
    telemetry = GatewayTelemetry(Tracing("llmserve-gateway", spans, batch=False, sample_ratio=0.0), access_log=False)
    a = Behaviour("a")
    with stack({"v1": [a]}, telemetry=telemetry) as s:
        r = s.chat("hi")
        assert r.status_code == 200 and "trace" not in parse_server_timing(r.headers["server-timing"])
        sampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        assert s.chat("hi", headers={"traceparent": sampled}).status_code == 200
    unsampled, followed = (h["traceparent"] for h in a.headers)
    assert unsampled.endswith("-00")  # the instance is told not to record either
    assert followed.split("-")[1] == sampled.split("-")[1] and followed.endswith("-01")  # the caller decides
    assert {s.context.trace_id for s in spans.get_finished_spans()} == {int(sampled.split("-")[1], 16)}
