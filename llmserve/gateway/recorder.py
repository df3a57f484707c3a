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
from typing import TYPE_CHECKING

from llmserve.gateway.canary_evidence import Outcome, OutcomeSink
from llmserve.gateway.events import RequestObserver
from llmserve.gateway.metrics import GatewayMetrics

if TYPE_CHECKING:  # the request path's type; the runtime, which imports this, has no HTTP
    from llmserve.gateway.request import ParsedRequest


@dataclass(frozen=True, slots=True)
class RecordSinks:
    """Where one model's request outcomes go."""

    model: str
    metrics: GatewayMetrics  # the gateway's
    outcomes: OutcomeSink | None  # the model's canary analysis, if it has one
    observers: list[RequestObserver]  # the gateway's list itself: services join it later


class RequestRecord:
    """One request's bookkeeping; the proxy tells it what happened (routed, waited, sent,
    retried, resumed, first token, finished) and it feeds the sinks."""

    __slots__ = ("done", "in_stats", "instance", "model", "output_tokens", "parsed", "queued_s",
                 "request_id", "sinks", "t0", "ttft_s", "version")

    def __init__(self, sinks: RecordSinks, version: str, parsed: ParsedRequest, t0: float,
                 request_id: str, *, in_stats: bool = True) -> None:
        self.sinks, self.model = sinks, sinks.model
        self.version, self.parsed, self.t0 = version, parsed, t0
        self.request_id = request_id
        self.in_stats = in_stats  # counts in the canary analysis's evidence
        self.instance: str | None = None
        self.ttft_s: float | None = None
        self.queued_s = 0.0
        self.output_tokens = 0
        self.done = False

    def arrived(self, reason: str) -> None:
        """Routed to this record's version for ``reason``: counted, and told to the observers."""
        m = self.sinks.metrics
        m.child(m.routed, self.model, self.version, reason).inc()
        if self.sinks.observers:
            chars = prompt_chars(self.parsed.body)
            for o in self.sinks.observers:
                o.on_arrival(self.model, self.version, self.t0, chars)

    def waited(self, queued_s: float, cold: bool) -> None:
        """A queue wait for an instance; ``cold``: its pool had no ready instance then."""
        self.queued_s += queued_s
        if cold:
            m = self.sinks.metrics
            m.child(m.cold_wait, self.model, self.version).observe(queued_s)

    def sent(self, instance: str) -> None:
        """An attempt (the first or a retry) goes to ``instance``."""
        self.instance = instance
        m = self.sinks.metrics
        m.child(m.upstream, self.model, self.version, instance).inc()

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
            o.on_first_token(self.model, self.version, self.t0 + self.ttft_s, self.ttft_s)

    @property
    def counts_tokens(self) -> bool:
        """Whether anyone reads ``output_tokens`` (an observer, the canary analysis)."""
        return bool(self.sinks.observers) or self.sinks.outcomes is not None

    def finish(self, status: int, *, ok: bool, error_kind: str | None = None) -> None:
        """Record the request's outcome once; ``ok`` is False only for upstream faults."""
        if self.done:
            return
        self.done = True
        sinks, m = self.sinks, self.sinks.metrics
        labels = (self.model, self.version, self.parsed.priority_class.name.lower())
        e2e = time.monotonic() - self.t0
        m.child(m.requests, *labels, str(status)).inc()
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
                        ok and status < 400)


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


def prompt_chars(body: dict) -> int:
    """Characters of prompt text in a request, for arrival-size signals."""
    if isinstance(body.get("messages"), list):
        total = 0
        for m in body["messages"]:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                total += len(c)
            elif isinstance(c, list):
                total += sum(len(p.get("text", "")) for p in c if isinstance(p, dict))
        return total
    p = body.get("prompt")
    if isinstance(p, str):
        return len(p)
    if isinstance(p, list):
        return sum(len(x) if isinstance(x, str | list) else 1 for x in p)
    return 0
