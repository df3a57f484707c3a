"""The gateway's Prometheus metrics, all under ``llmserve:gateway_``.

Counters and histograms are updated on the request path; gauges (queue depth,
in flight, breaker state, canary weight) are read from the live state at scrape
time by a collector, so they can never drift from it. One registry per app, so
several gateways (tests) can live in one process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# No ``*_created`` series, as vLLM (and server/metrics.py): they were 100 of the
# gateway's 327 samples, each shown as a gauge family of its own. Process-wide.
disable_created_metrics()

P = "llmserve:gateway_"
CANARY_STATES = ("idle", "progressing", "paused", "promoted", "rolled_back")  # gateway/canary.py's CanaryState
_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0,
                    120.0, 300.0)
_QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                  300.0, 600.0)


class GatewayMetrics:
    def __init__(self, gauges: Callable[[], Iterable[GaugeMetricFamily]]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model", "version", "class"]
        self.requests = Counter(f"{P}requests", "Requests answered, by HTTP status",
                                labels + ["status"], registry=self.registry)
        self.errors = Counter(f"{P}errors", "Requests that failed, by kind",
                              labels + ["kind"], registry=self.registry)
        self.ttft = Histogram(f"{P}time_to_first_token_seconds",
                              "Arrival to first streamed byte (streaming requests)", labels,
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram(f"{P}e2e_request_latency_seconds", "Arrival to last byte", labels,
                             buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.queue_time = Histogram(f"{P}queue_time_seconds",
                                    "Time waiting in the gateway's admission queue", labels,
                                    buckets=_QUEUE_BUCKETS, registry=self.registry)
        self.cold_wait = Histogram(f"{P}cold_start_wait_seconds",
                                   "Queue wait of requests that found no ready instance in their pool "
                                   "(scale from zero, a revival or a start)", ["model", "version"],
                                   buckets=_QUEUE_BUCKETS, registry=self.registry)
        self.upstream = Counter(f"{P}upstream_requests", "Attempts sent to each instance",
                                ["model", "version", "instance"], registry=self.registry)
        self.retries = Counter(f"{P}retries", "Attempts retried on another instance",
                               ["model", "version"], registry=self.registry)
        self.resumes = Counter(f"{P}stream_resumes", "Streams whose upstream broke mid-way, by outcome: "
                               "resumed on another instance, not_resumable (ended with an error event: "
                               "resuming is off or cannot continue it) or failed (no instance could)",
                               ["model", "version", "outcome"], registry=self.registry)
        self.routed = Counter(f"{P}routed", "Version choices, by reason: random (weighted), sticky (hashed "
                              "from the user), pinned (where the user went last), header (forced)",
                              ["model", "version", "reason"], registry=self.registry)
        self.prompt_tokens = Counter(f"{P}prompt_tokens", "Prompt tokens of answered requests, from the "
                                     "instance's usage (whole answers)", ["model", "version"], registry=self.registry)
        self.generation_tokens = Counter(f"{P}generation_tokens", "Tokens generated for answered requests: the "
                                         "usage of whole answers, one per data event of streams",
                                         ["model", "version"], registry=self.registry)
        self.canary_verdicts = Counter(f"{P}canary_verdicts", "The canary analysis' decisions, by action (advance, "
                                       "hold, skip, inconclusive, promote, rollback, start, pause, resume)",
                                       ["model", "canary", "action"], registry=self.registry)
        self.registry.register(_Gauges(gauges))
        self._children: dict[tuple[int, tuple[str, ...]], object] = {}

    def child(self, metric, *values: str):
        """``metric.labels(*values)``, memoised: ``labels()`` takes a lock and validates
        every call, ~20 µs here, and the request path makes half a dozen."""
        key = (id(metric), values)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = metric.labels(*values)
        return c

    def count_tokens(self, model: str, version: str, prompt: int | None, generated: int) -> None:
        """An answered request's tokens (the recorder's ``prompt_tokens``/``output_tokens``)."""
        if prompt:
            self.child(self.prompt_tokens, model, version).inc(prompt)
        if generated:
            self.child(self.generation_tokens, model, version).inc(generated)

    def canary_decided(self, model: str, canary: str, action: str) -> None:
        """A canary decision (``Action.value``); ``none`` (no look was due) is not one."""
        if action != "none":
            self.child(self.canary_verdicts, model, canary, action).inc()

    @staticmethod
    def canary_gauges(models: Iterable[Any]) -> list[GaugeMetricFamily]:
        """Each model's rollout, read at scrape time: its state (1 for the current one, 0 for
        the others) and the failed checks counted toward its rollback. ``models``: objects
        with ``name`` and ``canary`` (a ``CanaryAnalysis`` or None), the runtime's."""
        labels = ["model", "canary", "stable"]
        state = gauge("canary_state", "1 for the rollout's current state", labels + ["state"])
        failed = gauge("canary_failed_checks", "Failed checks counted toward a rollback (threshold: "
                       "canary.failure_threshold)", labels)
        for rt in models:
            c = rt.canary
            if c is None:
                continue
            ids = [rt.name, c.canary, c.stable]
            for s in CANARY_STATES:
                state.add_metric(ids + [s], float(c.state.value == s))
            failed.add_metric(ids, c.failed_checks)
        return [state, failed]

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _Gauges(Collector):
    def __init__(self, produce: Callable[[], Iterable[GaugeMetricFamily]]) -> None:
        self._produce = produce

    def collect(self) -> Iterable[GaugeMetricFamily]:
        return self._produce()

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []


def gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{P}{name}", doc, labels=labels)
