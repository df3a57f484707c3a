"""The OTLP bytes llmserve writes itself decode to the very message the SDK's own
encoder (``encode_spans``) builds from the same spans: the SDK is the oracle."""

from __future__ import annotations

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.trace.status import Status, StatusCode

from llmserve.tracing.otlp_wire import OTLPTraceEncoder
from llmserve.tracing.provider import Tracing

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
ODD = {"s": "naïve ☃", "t": True, "f": False, "one": 1, "neg": -7, "big": 2**62 + 3, "x": 0.25, "nx": -1e300,
       "list": ["stop", "length"], "ints": [1, -2], "empty": "", "zero": 0, "bytes": b"\x00\x01"}


def _same(spans) -> None:
    mine = OTLPTraceEncoder()
    want = encode_spans(spans)
    for _ in range(2):  # the second time from the cached parts
        assert ExportTraceServiceRequest.FromString(mine.encode(spans)) == want


def test_spans_made_at_the_end_of_a_request_encode_as_the_sdk_encodes_them():
    out = InMemorySpanExporter()
    tr = Tracing("svc", out, batch=False)
    ctx = tr.context({"traceparent": TP, "tracestate": "vendor=abc,other=1"})
    root, child = tr.span_id(), tr.span_id()
    tr.emit(ctx, [("child", child, root, SpanKind.CLIENT, 10, 20, {**ODD, "n": 1}, Status(StatusCode.ERROR, "boom")),
                  ("root ☃", root, None, SpanKind.SERVER, 5, 30, {"n": True}, None)])
    tr.emit_records([["engine.request", "ab" * 16, "cd" * 8, "ef" * 8, 1, 2, {"gen_ai.usage.output_tokens": 3}, 99],
                     ["engine.queue", "ab" * 16, "12" * 8, "cd" * 8, 1, 2, {}, 99]], "llmserve-engine")
    spans = out.get_finished_spans()
    assert len(spans) == 4 and len({id(s.resource) for s in spans}) == 2
    assert spans[1].parent.is_remote and not spans[0].parent.is_remote  # the flags' two cases
    _same(spans)


def test_spans_of_the_sdks_own_tracer_encode_as_the_sdk_encodes_them():
    out = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "sdk"}, "https://example.com/schema"))
    provider.add_span_processor(SimpleSpanProcessor(out))
    for scope in ("a", "b"):
        tracer = provider.get_tracer(scope, "1.0", schema_url="https://opentelemetry.io/schemas/1.21.0")
        with tracer.start_as_current_span("outer", kind=SpanKind.SERVER, attributes=ODD) as outer:
            outer.set_status(Status(StatusCode.OK))
            with tracer.start_as_current_span("inner", attributes={"k": "v"}):
                pass
    _same(out.get_finished_spans())
    with provider.get_tracer("c").start_as_current_span("with an event") as s:
        s.add_event("e", {"k": 1})  # (written by the SDK's encoder: this one does not do events)
    _same(out.get_finished_spans())
