"""An instance's side of a request's telemetry: its server span, the engine's phases.

:class:`InstanceTelemetry` wraps the instance's ASGI app. For each generation
request it draws its SERVER span's id under the caller's ``traceparent`` (the
gateway's attempt), and leaves a :class:`RequestTelemetry` in the ASGI scope: serving
reads the ``traceparent`` to hand the engine (whose spans then join this one) and
gives it each sequence's final output. When the response is sent it adds
``Server-Timing`` to a whole answer, makes the span (with the GenAI usage
attributes: nothing of it is built before then), hands it and the engine's span
records to the exporter and writes the JSON access-log line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llmserve.tracing.timing import access_line, access_logger, server_timing

if TYPE_CHECKING:  # OpenTelemetry is imported only when tracing is on (~0.2 s at start)
    from llmserve.engine.outputs import RequestOutput
    from llmserve.tracing.provider import TraceContext, Tracing

TELEMETRY_KEY = "llmserve.telemetry"  # in the ASGI scope
OPERATIONS = {"/v1/chat/completions": "chat", "/v1/completions": "text_completion"}  # gen_ai.operation.name
ENGINE_SERVICE = "llmserve-engine"  # the engine process's spans


def request_telemetry(scope: dict) -> RequestTelemetry | None:
    return scope.get(TELEMETRY_KEY)


class RequestTelemetry:
    """One generation request's engine phases and usage, from its sequences' final outputs."""

    __slots__ = ("arrival", "cached", "ctx", "finished", "first_token", "input_tokens", "output_tokens", "records",
                 "scheduled", "span_id", "start_ns", "traceparent")

    def __init__(self, traceparent: str | None = None) -> None:
        self.traceparent = traceparent  # for the engine: None when not traced
        self.ctx: TraceContext | None = None  # the trace, when tracing is on
        self.span_id = self.start_ns = 0  # the instance's span, when recorded
        self.arrival = self.scheduled = self.first_token = self.finished = None
        self.input_tokens = self.output_tokens = self.cached = 0
        self.records: list[list] = []

    def output(self, out: RequestOutput) -> None:
        """A sequence's final output."""
        m = out.metrics
        if m is not None:
            self.arrival = _first(self.arrival, m.arrival_time)
            self.scheduled = _first(self.scheduled, m.first_scheduled_time)
            self.first_token = _first(self.first_token, m.first_token_time)
            if m.finished_time is not None:
                self.finished = max(self.finished or m.finished_time, m.finished_time)
        if out.request_id.endswith("-0"):  # the first sequence of its prompt (serving's ids)
            self.input_tokens += len(out.prompt_token_ids)
            self.cached += out.num_cached_tokens
        self.output_tokens += len(out.outputs[0].token_ids)
        if out.spans:
            self.records += out.spans

    def phases_ms(self) -> dict[str, float]:
        """queue, prefill, decode in milliseconds (those that happened)."""
        out: dict[str, float] = {}
        marks = (("queue", self.arrival, self.scheduled), ("prefill", self.scheduled, self.first_token),
                 ("decode", self.first_token, self.finished))
        for name, a, b in marks:
            if a is not None and b is not None:
                out[name] = (b - a) * 1000
        return out


def _first(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


class InstanceTelemetry:
    """ASGI wrapper: the telemetry of generation requests (others pass straight through)."""

    def __init__(self, app: Any, tracing: Tracing | None, access_log: bool, model_name: Callable[[], str]) -> None:
        self.app, self.tracing, self.model_name = app, tracing, model_name
        self.log = access_logger() if access_log else None

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        op = OPERATIONS.get(scope.get("path", "")) if scope["type"] == "http" and scope["method"] == "POST" else None
        if op is None:
            return await self.app(scope, receive, send)
        t0 = time.monotonic()
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]
                   if k in (b"traceparent", b"tracestate", b"x-request-id")}
        tel = self.begin(headers)
        scope[TELEMETRY_KEY] = tel
        status = 0

        async def send_timed(msg: dict) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
                phases = tel.phases_ms()
                if phases:  # a whole answer: its engine phases are known before its head
                    value = server_timing((k, v, None) for k, v in phases.items())
                    msg = {**msg, "headers": [*msg.get("headers", ()), (b"server-timing", value.encode())]}
            await send(msg)

        try:
            await self.app(scope, receive, send_timed)
        finally:
            self.end(tel, status, t0, headers.get("x-request-id"), op, scope["path"])

    def begin(self, headers: dict[str, str]) -> RequestTelemetry:
        """A request's telemetry, in the trace its caller's ``traceparent`` names."""
        tel = RequestTelemetry()
        if self.tracing is not None:
            tel.ctx = ctx = self.tracing.context(headers)
            if ctx.sampled:  # (an unsampled trace stays unrecorded in the engine too)
                tel.span_id, tel.start_ns = self.tracing.span_id(), time.time_ns()
                tel.traceparent = ctx.traceparent(tel.span_id)
        return tel

    def end(self, tel: RequestTelemetry, status: int, t0: float, request_id: str | None, op: str,
            path: str) -> None:
        """The response is sent: its span and the engine's, its access-log line."""
        phases = tel.phases_ms()
        ctx = tel.ctx
        if ctx is not None and ctx.sampled:
            from opentelemetry.trace import SpanKind
            from opentelemetry.trace.status import Status, StatusCode

            model = self.model_name()
            attrs = {"gen_ai.operation.name": op, "gen_ai.request.model": model, "gen_ai.system": "llmserve",
                     "http.request.method": "POST", "url.path": path,
                     "gen_ai.usage.input_tokens": tel.input_tokens, "gen_ai.usage.output_tokens": tel.output_tokens,
                     "gen_ai.response.model": model, "http.response.status_code": status,
                     **{f"llmserve.{k}_ms": v for k, v in phases.items()}}
            failed = Status(StatusCode.ERROR, f"HTTP {status}" if status else "no response") \
                if status >= 500 or status == 0 else None
            self.tracing.emit(ctx, [(f"{op} {model}", tel.span_id, None, SpanKind.SERVER, tel.start_ns, time.time_ns(),
                                     attrs, failed)])
            if tel.records:
                self.tracing.emit_records(tel.records, ENGINE_SERVICE)
        if self.log is not None:
            self.log.info(access_line({
                "time": round(time.time(), 3), "request_id": request_id,
                "trace_id": f"{ctx.trace_id:032x}" if ctx is not None else None, "path": path, "status": status,
                "model": self.model_name(), "e2e_ms": round((time.monotonic() - t0) * 1000, 2),
                **{f"{k}_ms": round(v, 2) for k, v in phases.items()},
                "input_tokens": tel.input_tokens, "output_tokens": tel.output_tokens, "cached_tokens": tel.cached}))
