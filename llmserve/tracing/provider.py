"""One process's tracer: spans to an OTLP/HTTP collector, or to the exporter a test hands in.

Nothing here is global: the OpenTelemetry global tracer provider is left alone, and
each component is handed the :class:`Tracing` it uses. The batch processor exports
from its own thread, so a request never waits on the collector.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.status import Status, StatusCode

from llmserve.tracing.config import TracingConfig

_PROPAGATOR = TraceContextTextMapPropagator()


class Tracing:
    """A tracer provider of one service, and the W3C trace-context conversions it needs."""

    def __init__(self, service_name: str, exporter: SpanExporter, *, batch: bool = True,
                 sample_ratio: float = 1.0) -> None:
        self.service_name = service_name
        self.resource = Resource.create({"service.name": service_name, "process.pid": os.getpid()})
        self.provider = TracerProvider(resource=self.resource,
                                       sampler=ParentBased(TraceIdRatioBased(sample_ratio)))
        self.processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("llmserve")
        self._scope = InstrumentationScope("llmserve")
        self._resources: dict[tuple[str, int], Resource] = {}  # of the processes whose spans it exports

    @classmethod
    def start(cls, config: TracingConfig) -> Tracing | None:
        """The configured tracer, or None when tracing is off."""
        if not config.enabled:
            return None
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return cls(config.service_name, OTLPSpanExporter(endpoint=config.traces_url),
                   sample_ratio=config.sample_ratio)

    # ---- W3C trace context ------------------------------------------------------------
    @staticmethod
    def extract(headers: Mapping[str, str] | None) -> Context | None:
        """The caller's context from ``traceparent``/``tracestate`` (None: a new trace)."""
        if not headers or "traceparent" not in headers:
            return None
        return _PROPAGATOR.extract({k: headers[k] for k in ("traceparent", "tracestate") if k in headers})

    @staticmethod
    def traceparent(span: Span) -> str | None:
        """``span``'s W3C ``traceparent`` (its sampled flag tells the next hop whether to
        record), or None for an invalid one."""
        c = span.get_span_context()
        if not c.is_valid:
            return None
        # Only the sampled bit: W3C level-1 peers know no other flag.
        return f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags) & 1:02x}"

    def start_span(self, name: str, parent: Span | Context | None, *, kind: SpanKind = SpanKind.INTERNAL,
                   start_ns: int | None = None, attributes: Mapping | None = None) -> Span:
        ctx = trace.set_span_in_context(parent) if isinstance(parent, Span) else parent
        return self.tracer.start_span(name, context=ctx, kind=kind, start_time=start_ns, attributes=attributes)

    # ---- spans made in another process ------------------------------------------------
    def emit_records(self, records: Iterable[list], service_name: str) -> None:
        """Spans another process recorded as plain data (the engine process:
        ``llmserve.engine.trace_spans``), handed to this process's exporter."""
        flags = TraceFlags(TraceFlags.SAMPLED)
        for name, trace_id, span_id, parent_id, start, end, attrs, pid in records:
            resource = self._resources.get((service_name, pid))
            if resource is None:  # (Resource.create reads the environment and merges: once per process)
                resource = self._resources[(service_name, pid)] = Resource.create(
                    {"service.name": service_name, "process.pid": pid})
            tid = int(trace_id, 16)
            ctx = SpanContext(tid, int(span_id, 16), is_remote=False, trace_flags=flags)
            parent = SpanContext(tid, int(parent_id, 16), is_remote=True, trace_flags=flags)
            span = ReadableSpan(name, ctx, parent, resource, attrs,
                                kind=SpanKind.INTERNAL, status=Status(StatusCode.UNSET), start_time=start,
                                end_time=end, instrumentation_scope=self._scope)
            self.processor.on_end(span)

    def shutdown(self) -> None:
        """Export what is buffered and stop the export thread."""
        self.provider.shutdown()

