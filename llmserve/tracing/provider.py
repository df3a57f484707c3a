"""One process's tracer: spans to an OTLP/HTTP collector, or to the exporter a test hands in.

Nothing here is global: the OpenTelemetry global tracer provider is left alone, and
each component is handed the :class:`Tracing` it uses. The batch processor exports
from its own thread, so a request never waits on the collector.

A request's spans are not the SDK's live ``Span`` objects (about 25 µs each to start
and end, a lock and a context each): the request path notes plain start and end
times, and when the request is over :meth:`Tracing.emit` makes the finished spans
(the SDK's ``ReadableSpan``, what a live span becomes when it ends) in one go, with
the SDK's own id generator, sampler, resource and processor.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.status import Status, StatusCode

from llmserve.tracing.config import TracingConfig

_PROPAGATOR = TraceContextTextMapPropagator()
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)

# A finished span as plain data: (name, span id, parent span id (None: the trace's
# parent), kind, start ns, end ns, attributes, status (None: unset)).
SpanTuple = tuple[str, int, "int | None", SpanKind, int, int, "Mapping[str, Any]", "Status | None"]


@dataclass(frozen=True, slots=True)
class TraceContext:
    """Where one request's spans go: its trace, the caller's span (None: it began the
    trace) and whether it is recorded (the caller's decision, else the sampler's)."""

    trace_id: int
    parent: SpanContext | None
    sampled: bool
    trace_state: TraceState

    @property
    def trace_id_hex(self) -> str | None:
        """The id people look up, or None when the trace is recorded nowhere."""
        return f"{self.trace_id:032x}" if self.sampled else None

    def traceparent(self, span_id: int) -> str:
        """W3C ``traceparent`` of the span ``span_id`` of this trace for the next hop
        (only the sampled bit: level-1 peers know no other flag)."""
        return f"00-{self.trace_id:032x}-{span_id:016x}-{int(self.sampled):02x}"


class Tracing:
    """A tracer provider of one service: its requests' trace contexts and finished spans."""

    def __init__(self, service_name: str, exporter: SpanExporter, *, batch: bool = True,
                 sample_ratio: float = 1.0) -> None:
        self.service_name = service_name
        self.resource = Resource.create({"service.name": service_name, "process.pid": os.getpid()})
        self.provider = TracerProvider(resource=self.resource,
                                       sampler=ParentBased(TraceIdRatioBased(sample_ratio)))
        self.processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        self.provider.add_span_processor(self.processor)
        self._ids, self._sampler = self.provider.id_generator, self.provider.sampler
        self._scope = InstrumentationScope("llmserve")
        self._resources: dict[tuple[str, int], Resource] = {}  # of the processes whose spans it exports

    @classmethod
    def start(cls, config: TracingConfig) -> Tracing | None:
        """The configured tracer, or None when tracing is off."""
        if not config.enabled:
            return None
        from llmserve.tracing.otlp_wire import OTLPWireExporter

        return cls(config.service_name, OTLPWireExporter(endpoint=config.traces_url),
                   sample_ratio=config.sample_ratio)

    # ---- W3C trace context ------------------------------------------------------------
    @staticmethod
    def extract(headers: Mapping[str, str] | None) -> Context | None:
        """The caller's context from ``traceparent``/``tracestate`` (None: a new trace)."""
        if not headers or "traceparent" not in headers:
            return None
        return _PROPAGATOR.extract({k: headers[k] for k in ("traceparent", "tracestate") if k in headers})

    def span_id(self) -> int:
        return self._ids.generate_span_id()

    def context(self, headers: Mapping[str, str] | None, name: str = "request") -> TraceContext:
        """A request's trace from the caller's ``traceparent``/``tracestate`` (none: a new
        trace, recorded as the sampler decides)."""
        parent_ctx = self.extract(headers)
        parent = trace.get_current_span(parent_ctx).get_span_context() if parent_ctx is not None else None
        if parent is not None and not parent.is_valid:
            parent = None
        trace_id = parent.trace_id if parent is not None else self._ids.generate_trace_id()
        got = self._sampler.should_sample(parent_ctx, trace_id, name)
        state = got.trace_state if got.trace_state is not None else TraceState()
        return TraceContext(trace_id, parent, got.decision.is_sampled(), state)

    def emit(self, ctx: TraceContext, spans: Iterable[SpanTuple], resource: Resource | None = None) -> None:
        """A recorded request's finished spans, to the exporter."""
        if not ctx.sampled:
            return
        resource = resource or self.resource
        tid, state, on_end = ctx.trace_id, ctx.trace_state, self.processor.on_end
        contexts: dict[int, SpanContext] = {}
        made = []
        for name, span_id, parent_id, kind, start, end, attrs, status in spans:
            c = contexts[span_id] = SpanContext(tid, span_id, False, _SAMPLED, state)
            made.append((name, c, parent_id, kind, start, end, attrs, status))
        for name, c, parent_id, kind, start, end, attrs, status in made:
            parent = ctx.parent if parent_id is None else contexts.get(parent_id) or SpanContext(
                tid, parent_id, True, _SAMPLED, state)  # (a span of the caller's process)
            on_end(ReadableSpan(name, c, parent, resource, attrs, kind=kind, status=status or _UNSET,
                                start_time=start, end_time=end, instrumentation_scope=self._scope))

    # ---- spans made in another process ------------------------------------------------
    def emit_records(self, records: Iterable[list], service_name: str) -> None:
        """Spans another process recorded as plain data (the engine process:
        ``llmserve.engine.trace_spans``), handed to this process's exporter."""
        by_trace: dict[tuple[str, int], list] = {}
        for name, trace_id, span_id, parent_id, start, end, attrs, pid in records:
            by_trace.setdefault((trace_id, pid), []).append(
                (name, int(span_id, 16), int(parent_id, 16), SpanKind.INTERNAL, start, end, attrs, None))
        for (trace_id, pid), spans in by_trace.items():
            resource = self._resources.get((service_name, pid))
            if resource is None:  # (Resource.create reads the environment and merges: once per process)
                resource = self._resources[(service_name, pid)] = Resource.create(
                    {"service.name": service_name, "process.pid": pid})
            self.emit(TraceContext(int(trace_id, 16), None, True, TraceState()), spans, resource)

    def shutdown(self) -> None:
        """Export what is buffered and stop the export thread."""
        self.provider.shutdown()
