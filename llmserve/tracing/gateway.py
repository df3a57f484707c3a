"""The gateway's side of a request's telemetry: its spans and its access-log line.

The gateway's request record (``gateway/recorder.py``) already hears of every step
(routed, waited, sent, resumed, finished); with tracing on it tells a
:class:`RequestTrace` too, which makes the spans::

    chat <model>            SERVER, under the client's traceparent if it sent one
      gateway.route         the version and why (weight, sticky, header)
      gateway.admission     the queue wait for an instance, and the instance it got
      gateway.attempt       CLIENT, one per upstream attempt (a retry, a resume); its
                            traceparent goes to the instance, whose spans join here

An attempt ends when the next one's admission begins (it failed), or with the
request. Attribute names follow OpenTelemetry's GenAI conventions where they
have one (``gen_ai.*``), else ``llmserve.*``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import SpanKind
from opentelemetry.trace.status import Status, StatusCode

from llmserve.tracing.timing import access_line, access_logger

if TYPE_CHECKING:
    from llmserve.tracing.provider import Tracing

_OPERATIONS = {"messages": "chat", "prompt": "text_completion"}
_PARAMS = {"max_tokens": "gen_ai.request.max_tokens", "max_completion_tokens": "gen_ai.request.max_tokens",
           "temperature": "gen_ai.request.temperature", "top_p": "gen_ai.request.top_p",
           "top_k": "gen_ai.request.top_k", "seed": "gen_ai.request.seed"}


class GatewayTelemetry:
    """The gateway's tracer (None: no spans) and access log (off: no lines)."""

    def __init__(self, tracing: Tracing | None, access_log: bool) -> None:
        self.tracing = tracing
        self.log = access_logger() if access_log else None

    def trace(self, headers: Any, body: dict, model: str, request_id: str, t0: float) -> RequestTrace | None:
        if self.tracing is None:
            return None
        return RequestTrace(self.tracing, headers, body, model, request_id, t0)

    def access(self, fields: dict) -> None:
        if self.log is not None:
            self.log.info(access_line(fields))


def _ns_ago(seconds: float) -> int:
    return time.time_ns() - int(seconds * 1e9)


class RequestTrace:
    """One request's gateway spans."""

    __slots__ = ("_admission", "_attempt", "root", "trace_id", "tracing")

    def __init__(self, tracing: Tracing, headers: Any, body: dict, model: str, request_id: str,
                 t0: float) -> None:
        self.tracing = tracing
        op = next((v for k, v in _OPERATIONS.items() if k in body), "chat")
        attrs = {"gen_ai.operation.name": op, "gen_ai.request.model": model, "gen_ai.system": "llmserve",
                 "llmserve.request_id": request_id, "llmserve.stream": bool(body.get("stream"))}
        for k, name in _PARAMS.items():
            v = body.get(k)
            if isinstance(v, int | float) and not isinstance(v, bool):
                attrs[name] = v
        self.root = tracing.start_span(f"{op} {model}", tracing.extract(headers), kind=SpanKind.SERVER,
                                       start_ns=_ns_ago(time.monotonic() - t0), attributes=attrs)
        # The id, if the trace is recorded (an unsampled one is found nowhere).
        self.trace_id = f"{self.root.get_span_context().trace_id:032x}" if self.root.is_recording() else None
        self._admission: tuple[int, int, dict] | None = None  # (start, end, attributes) until its instance is known
        self._attempt = None

    def routed(self, version: str, reason: str, weights: dict[str, float]) -> None:
        now = time.time_ns()
        self.tracing.start_span("gateway.route", self.root, start_ns=now, attributes={
            "llmserve.version": version, "llmserve.route.reason": reason,
            **{f"llmserve.route.weight.{v}": w for v, w in weights.items()}}).end(now)
        self.root.set_attribute("llmserve.version", version)

    def waited(self, queued_s: float, cold: bool, priority_class: str) -> None:
        start = _ns_ago(queued_s)
        self._end_attempt(start, failed=True)  # a wait for another instance: the last attempt failed
        self._flush_admission()
        self._admission = (start, time.time_ns(), {"llmserve.queue.cold": cold,
                                                   "llmserve.priority_class": priority_class})

    def attempt(self, instance: str, headers: dict[str, str], n: int, resumed_after: int | None) -> None:
        """An upstream attempt begins; its traceparent replaces the one in ``headers``."""
        self._end_attempt(time.time_ns(), failed=True)
        self._flush_admission(instance)
        attrs: dict[str, Any] = {"llmserve.instance": instance, "llmserve.attempt": n}
        if resumed_after is not None:
            attrs["llmserve.resumed_after_tokens"] = resumed_after
        self._attempt = self.tracing.start_span("gateway.attempt", self.root, kind=SpanKind.CLIENT, attributes=attrs)
        tp = self.tracing.traceparent(self._attempt)
        if tp is not None:
            headers["traceparent"] = tp

    def finish(self, status: int, ok: bool, error_kind: str | None, attrs: dict[str, Any]) -> None:
        now = time.time_ns()
        self._flush_admission()
        failed = not ok or status >= 500
        if self._attempt is not None:
            self._attempt.set_attribute("http.response.status_code", status)
            self._end_attempt(now, failed=failed)
        root = self.root
        root.set_attributes({"http.response.status_code": status, **attrs})
        if error_kind is not None:
            root.set_attribute("error.type", error_kind)
        if failed:
            root.set_status(Status(StatusCode.ERROR, error_kind or f"HTTP {status}"))
        root.end(now)

    def _flush_admission(self, instance: str | None = None) -> None:
        if self._admission is None:
            return
        start, end, attrs = self._admission
        self._admission = None
        if instance is not None:
            attrs["llmserve.instance"] = instance
        self.tracing.start_span("gateway.admission", self.root, start_ns=start, attributes=attrs).end(end)

    def _end_attempt(self, at: int, failed: bool) -> None:
        a, self._attempt = self._attempt, None
        if a is None:
            return
        if failed:
            a.set_status(Status(StatusCode.ERROR, "the attempt failed"))
        a.end(at)
