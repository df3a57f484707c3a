"""One request's record: the single place the request path feeds the gateway's metrics
(routing, attempts, retries, resumes, queue and cold-start waits, the outcome), the canary
analysis's evidence and the request observers (the autoscaler).

The analysis judges a *version*, so it is told every failed upstream attempt, not only
the request's final answer: the gateway retries a failed attempt on the same version's
pool, and a canary failing 60 % of its attempts answers only 0.6^3 = 22 % of requests
with an error after three attempts (issue 36: that is how such a canary got promoted).

A record is given those three as :class:`RecordSinks` by its model's runtime: it
needs them, not the runtime, so the recorder knows nothing of the gateway above it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmserve.gateway.canary_evidence import Outcome, OutcomeSink
from llmserve.gateway.events import RequestObserver
from llmserve.gateway.metrics import GatewayMetrics
from llmserve.priority import PriorityClass
from llmserve.tracing.timing import server_timing

if TYPE_CHECKING:  # the request path's type; the runtime, which imports this, has no HTTP
    from llmserve.gateway.request import ParsedRequest
    from llmserve.gateway.tenants.tab import Tab
    from llmserve.tracing.gateway import GatewayTelemetry


@dataclass(frozen=True, slots=True)
class RecordSinks:
    """Where one model's request outcomes go."""

    model: str
    metrics: GatewayMetrics  # the gateway's
    outcomes: OutcomeSink | None  # the model's canary analysis, if it has one
    observers: list[RequestObserver]  # the gateway's list itself: services join it later
    telemetry: GatewayTelemetry | None = None  # spans and access-log lines (llmserve.tracing)


class RequestRecord:
    """One request's bookkeeping; the proxy tells it what happened (routed, waited, sent,
    retried, resumed, first token, finished) and it feeds the sinks."""

    __slots__ = ("attempts", "done", "in_stats", "instance", "model", "output_tokens", "parsed", "prompt_tokens",
                 "queued_s", "rename", "request_id", "resumes", "route", "sinks", "t0", "tab", "trace", "ttft_s", "version")

    def __init__(self, sinks: RecordSinks, version: str, parsed: ParsedRequest, t0: float,
                 request_id: str, *, in_stats: bool = True, headers: Any = None) -> None:
        self.sinks, self.model = sinks, sinks.model
        self.version, self.parsed, self.t0 = version, parsed, t0
        self.request_id = request_id
        self.in_stats = in_stats  # counts in the canary analysis's evidence
        self.instance: str | None = None
        self.ttft_s: float | None = None
        self.queued_s = 0.0
        self.output_tokens = 0
        self.rename: tuple[tuple[bytes, bytes], ...] = ()  # the upstream's model name -> the client's (relay.py)
        self.prompt_tokens: int | None = None  # from a whole response's usage
        self.tab: Tab | None = None  # the key's account, settled at the end (gateway/tenants)
        self.done = False
        self.attempts = self.resumes = 0
        self.route = ""
        t = sinks.telemetry
        self.trace = None if t is None else t.trace(headers, parsed.body, parsed.model, request_id, t0)

    def arrived(self, reason: str, weights: dict[str, float] | None = None) -> None:
        """Routed to this record's version for ``reason`` (under ``weights``): counted, and
        told to the observers and the trace."""
        m = self.sinks.metrics
        m.child(m.routed, self.model, self.version, reason).inc()
        self.route = reason
        if self.trace is not None:
            self.trace.routed(self.version, reason, weights or {})
        if self.sinks.observers:
            for o in self.sinks.observers:
                o.on_arrival(self.model, self.version, self.t0, self.parsed.prompt_chars, self.batch)

    def waited(self, queued_s: float, cold: bool) -> None:
        """A queue wait for an instance; ``cold``: its pool had no ready instance then."""
        self.queued_s += queued_s
        if self.trace is not None:
            self.trace.waited(queued_s, cold, self.parsed.priority_class.name.lower())
        if cold:
            m = self.sinks.metrics
            m.child(m.cold_wait, self.model, self.version).observe(queued_s)

    def sent(self, instance: str, headers: dict[str, str] | None = None) -> None:
        """An attempt (the first or a retry) goes to ``instance`` with ``headers`` (whose
        traceparent becomes the attempt's when tracing)."""
        self.instance = instance
        self.attempts += 1
        m = self.sinks.metrics
        m.child(m.upstream, self.model, self.version, instance).inc()
        if self.trace is not None and headers is not None:
            self.trace.attempt(instance, headers, self.attempts, None)

    def resuming(self, instance: str, headers: dict[str, str], tokens: int) -> None:
        """A broken stream goes on at ``instance`` after the ``tokens`` the client has (not an
        attempt in the upstream counter: a resume is counted as a retry)."""
        self.instance = instance
        self.attempts += 1
        self.resumes += 1
        if self.trace is not None:
            self.trace.attempt(instance, headers, self.attempts, tokens)

    def retried(self) -> None:
        """Another attempt after a failed one, or a resumed stream."""
        m = self.sinks.metrics
        m.child(m.retries, self.model, self.version).inc()

    def attempt_failed(self, kind: str | None) -> None:
        """An attempt failed and another one went out (so the request's own outcome will
        not be this failure): the failure goes to the canary evidence now."""
        if self.in_stats and self.sinks.outcomes is not None:
            self.sinks.outcomes.record(self.version, time.time(), Outcome(error=kind or "upstream_5xx"))

    def resumed(self, outcome: str) -> None:
        """The stream's upstream broke mid-way: ``resumed``, ``not_resumable`` or ``failed``
        (``stream_resumes``)."""
        m = self.sinks.metrics
        m.child(m.resumes, self.model, self.version, outcome).inc()

    def first_token(self) -> None:
        """The first event reaches the client (once)."""
        if self.ttft_s is not None:
            return
        self.ttft_s = time.monotonic() - self.t0
        for o in self.sinks.observers:
            o.on_first_token(self.model, self.version, self.t0 + self.ttft_s, self.ttft_s, self.batch)

    @property
    def batch(self) -> bool:
        """Of the batch priority class (the observers keep it apart from realtime demand)."""
        return self.parsed.priority_class is PriorityClass.BATCH

    @property
    def rate_headers(self) -> dict[str, str]:
        """The key's x-ratelimit-* at admission (none for a key without windows)."""
        return self.tab.rate_headers if self.tab is not None else {}

    def server_timing(self, upstream: str | None) -> str:
        """The ``Server-Timing`` value: the gateway's entries, then the instance's."""
        own = server_timing((("admission", self.queued_s * 1000, None), ("attempts", None, str(self.attempts))))
        if self.trace is not None and self.trace.trace_id is not None:
            own += f', trace;desc="{self.trace.trace_id}"'
        return f"{own}, {upstream}" if upstream else own

    def finish(self, status: int, *, ok: bool, error_kind: str | None = None) -> None:
        """Record the request's outcome once; ``ok`` is False only for upstream faults."""
        if self.done:
            return
        self.done = True
        if self.tab is not None:
            self.tab.close(self.prompt_tokens, self.output_tokens, served=status < 400)
        sinks, m = self.sinks, self.sinks.metrics
        labels = (self.model, self.version, self.parsed.priority_class.name.lower())
        e2e = time.monotonic() - self.t0
        m.child(m.requests, *labels, str(status)).inc()
        if status < 400:
            m.count_tokens(self.model, self.version, self.prompt_tokens, self.output_tokens)
        if error_kind is not None or status >= 400:
            m.child(m.errors, *labels, error_kind or f"http_{status}").inc()
        if self.instance is not None:
            m.child(m.queue_time, *labels).observe(self.queued_s)
        if self.ttft_s is not None:
            m.child(m.ttft, *labels).observe(self.ttft_s)
        if ok and status < 400:
            m.child(m.e2e, *labels).observe(e2e)
        if sinks.outcomes is not None and self.in_stats and status != 499 and (
                self.instance is not None or not ok):
            sinks.outcomes.record(self.version, time.time(), self._outcome(status, ok, error_kind, e2e))
        for o in sinks.observers:
            o.on_finish(self.model, self.version, self.t0 + e2e, e2e, self.output_tokens,
                        ok and status < 400, self.batch)
        if sinks.telemetry is not None:
            self._telemetry(sinks.telemetry, status, ok, error_kind, e2e)

    def _telemetry(self, t: GatewayTelemetry, status: int, ok: bool, error_kind: str | None, e2e: float) -> None:
        timings = {"queue_ms": round(self.queued_s * 1000, 2), "e2e_ms": round(e2e * 1000, 2),
                   "ttft_ms": None if self.ttft_s is None else round(self.ttft_s * 1000, 2)}
        if self.trace is not None:
            self.trace.finish(status, ok, error_kind, {
                "gen_ai.usage.output_tokens": self.output_tokens, "llmserve.attempts": self.attempts,
                "llmserve.resumes": self.resumes, **{f"llmserve.{k}": v for k, v in timings.items() if v is not None}})
        if t.log is None:
            return
        t.access({"time": round(time.time(), 3), "request_id": self.request_id,
                  "trace_id": self.trace.trace_id if self.trace is not None else None, "model": self.model,
                  "version": self.version, "route": self.route, "instance": self.instance, "status": status,
                  "error": error_kind, "attempts": self.attempts, "resumes": self.resumes, **timings,
                  "output_tokens": self.output_tokens, "priority": self.parsed.priority,
                  "stream": self.parsed.stream})


    def _outcome(self, status: int, ok: bool, kind: str | None, e2e: float) -> Outcome:
        if not ok:
            return Outcome(error=kind or f"http_{status}")
        if status >= 400:  # a 4xx the version itself gave to a request sent to it
            return Outcome(refused=self.instance is not None)
        tokens = self.output_tokens or None
        tpot = None
        if tokens is not None and tokens > 1 and self.ttft_s is not None:
            tpot = (e2e - self.ttft_s) / (tokens - 1)
        return Outcome(ttft_s=self.ttft_s, tpot_s=tpot, e2e_s=e2e, output_tokens=tokens)
