"""One request's record: the single place its outcome feeds the gateway's metrics, the
canary analysis's window statistics and the request observers (the autoscaler).

A record is given those three as :class:`RecordSinks` by its model's runtime: it
needs them, not the runtime, so the recorder knows nothing of the gateway above it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmserve.gateway.events import RequestObserver
from llmserve.gateway.metrics import GatewayMetrics
from llmserve.gateway.window_stats import WindowStats

if TYPE_CHECKING:  # the request path's type; the runtime, which imports this, has no HTTP
    from llmserve.gateway.request import ParsedRequest


@dataclass(frozen=True, slots=True)
class RecordSinks:
    """Where one model's request outcomes go."""

    model: str
    metrics: GatewayMetrics  # the gateway's
    stats: WindowStats  # the model's, for its canary analysis
    observers: list[RequestObserver]  # the gateway's list itself: services join it later


class RequestRecord:
    """Per-request bookkeeping for metrics and canary stats."""

    __slots__ = ("done", "in_stats", "instance", "model", "output_tokens", "parsed", "queued_s",
                 "request_id", "sinks", "t0", "ttft_s", "version")

    def __init__(self, sinks: RecordSinks, version: str, parsed: ParsedRequest, t0: float,
                 request_id: str, *, in_stats: bool = True) -> None:
        self.sinks, self.model = sinks, sinks.model
        self.version, self.parsed, self.t0 = version, parsed, t0
        self.request_id = request_id
        self.in_stats = in_stats  # counts in the canary analysis's window stats
        self.instance: str | None = None
        self.ttft_s: float | None = None
        self.queued_s = 0.0
        self.output_tokens = 0
        self.done = False

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
        if self.in_stats and (self.instance is not None or not ok) and status != 499:
            sinks.stats.record(self.version, time.time(), ok, self.ttft_s,
                               e2e if ok and status < 400 else None)
        for o in sinks.observers:
            o.on_finish(self.model, self.version, self.t0 + e2e, e2e, self.output_tokens,
                        ok and status < 400)
