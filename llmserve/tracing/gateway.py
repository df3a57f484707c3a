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
    from llmserve.tracing.provider import SpanTuple, Tracing

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


_FAILED = Status(StatusCode.ERROR, "the attempt failed")


class RequestTrace:
    """One request's gateway spans, noted as plain times while it runs and made when it
    ends (``Tracing.emit``); an unsampled request only passes its trace context on."""

    __slots__ = ("_admission", "_attempt", "_body", "_model", "_request_id", "_route", "_spans", "_start", "ctx",
                 "root_id", "trace_id", "tracing")

    def __init__(self, tracing: Tracing, headers: Any, body: dict, model: str, request_id: str,
                 t0: float) -> None:
        self.tracing = tracing
        self.ctx = tracing.context(headers)
        self.root_id = tracing.span_id()
        self.trace_id = self.ctx.trace_id_hex  # (an unsampled one is found nowhere)
        self._start = _ns_ago(time.monotonic() - t0)
        self._body, self._model, self._request_id = body, model, request_id  # the root's attributes, at the end
        self._spans: list[SpanTuple] = []  # the finished children
        self._route: tuple[int, str, str, dict[str, float]] | None = None  # (at, version, reason, weights)
        self._admission: tuple[int, int, dict] | None = None  # (start, end, attributes) until its instance is known
        self._attempt: tuple[int, int, dict] | None = None  # (span id, start, attributes) until it ends

    def routed(self, version: str, reason: str, weights: dict[str, float]) -> None:
        if self.ctx.sampled:
            self._route = (time.time_ns(), version, reason, dict(weights))

    def waited(self, queued_s: float, cold: bool, priority_class: str) -> None:
        if not self.ctx.sampled:
            return
        start = _ns_ago(queued_s)
        self._end_attempt(start, failed=True)  # a wait for another instance: the last attempt failed
        self._flush_admission()
        self._admission = (start, time.time_ns(), {"llmserve.queue.cold": cold,
                                                   "llmserve.priority_class": priority_class})

    def attempt(self, instance: str, headers: dict[str, str], n: int, resumed_after: int | None) -> None:
        """An upstream attempt begins; its traceparent replaces the one in ``headers``."""
        span_id = self.tracing.span_id()
        headers["traceparent"] = self.ctx.traceparent(span_id)
        if not self.ctx.sampled:
            return
        now = time.time_ns()
        self._end_attempt(now, failed=True)
        self._flush_admission(instance)
        attrs: dict[str, Any] = {"llmserve.instance": instance, "llmserve.attempt": n}
        if resumed_after is not None:
            attrs["llmserve.resumed_after_tokens"] = resumed_after
        self._attempt = (span_id, now, attrs)

    def finish(self, status: int, ok: bool, error_kind: str | None, attrs: dict[str, Any]) -> None:
        if not self.ctx.sampled:
            return
        now = time.time_ns()
        self._flush_admission()
        failed = not ok or status >= 500
        if self._attempt is not None:
            self._attempt[2]["http.response.status_code"] = status
            self._end_attempt(now, failed=failed)
        root = self._root_attributes()
        if self._route is not None:
            at, version, reason, weights = self._route
            root["llmserve.version"] = version
            self._spans.append(("gateway.route", self.tracing.span_id(), self.root_id, SpanKind.INTERNAL, at, at,
                                {"llmserve.version": version, "llmserve.route.reason": reason,
                                 **{f"llmserve.route.weight.{v}": w for v, w in weights.items()}}, None))
        root.update({"http.response.status_code": status, **attrs})
        if error_kind is not None:
            root["error.type"] = error_kind
        self._spans.append((f"{root['gen_ai.operation.name']} {self._model}", self.root_id, None, SpanKind.SERVER,
                            self._start, now, root,
                            Status(StatusCode.ERROR, error_kind or f"HTTP {status}") if failed else None))
        self.tracing.emit(self.ctx, self._spans)

    def _root_attributes(self) -> dict[str, Any]:
        body = self._body
        op = next((v for k, v in _OPERATIONS.items() if k in body), "chat")
        attrs = {"gen_ai.operation.name": op, "gen_ai.request.model": self._model, "gen_ai.system": "llmserve",
                 "llmserve.request_id": self._request_id, "llmserve.stream": bool(body.get("stream"))}
        for k, name in _PARAMS.items():
            v = body.get(k)
            if isinstance(v, int | float) and not isinstance(v, bool):
                attrs[name] = v
        return attrs

    def _flush_admission(self, instance: str | None = None) -> None:
        if self._admission is None:
            return
        start, end, attrs = self._admission
        self._admission = None
        if instance is not None:
            attrs["llmserve.instance"] = instance
        self._spans.append(("gateway.admission", self.tracing.span_id(), self.root_id, SpanKind.INTERNAL, start,
                            end, attrs, None))

    def _end_attempt(self, at: int, failed: bool) -> None:
        a, self._attempt = self._attempt, None
        if a is not None:
            self._spans.append(("gateway.attempt", a[0], self.root_id, SpanKind.CLIENT, a[1], at, a[2],
                                _FAILED if failed else None))
