"""Prometheus metrics under vLLM's names, types, labels and buckets, so existing dashboards work.

TTFT, inter-token, e2e and queue-time histograms are fed by the engine thread through
the ``StatsListener`` hooks; the other per-request histograms and the gauges and
counters the engine already keeps are read at scrape time from its snapshot by a
custom collector (``engine/stats.py`` counts them), so nothing is double-counted.
Warm-up requests count in none of them (``engine/stats.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics
from prometheus_client.utils import floatToGoString
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from llmserve.engine.spec_policy import RATE_BUCKETS
from llmserve.engine.stats import HISTOGRAM_BOUNDS, REQUEST_LATENCY_BUCKETS, TOKEN_BUCKETS, TPOT_BUCKETS

if TYPE_CHECKING:
    from llmserve.engine.client import EngineClient

# As vLLM: no ``*_created`` series (each counter and histogram would carry one more
# sample, shown as a gauge family of its own). Process-wide, and every process that
# serves /metrics imports this module or gateway/metrics.py before its first metric.
disable_created_metrics()

# vLLM's (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = TPOT_BUCKETS
E2E_BUCKETS = REQUEST_LATENCY_BUCKETS
_HIST_DOCS = {
    "request_prompt_tokens": "Prompt tokens of each finished request.",
    "request_generation_tokens": "Generated tokens of each finished request.",
    "request_params_max_tokens": "The max_tokens parameter of each finished request that set it.",
    "request_time_per_output_token_seconds": "Per finished request: decode time / (output tokens - 1).",
    "request_prefill_time_seconds": "Per finished request: first scheduled to first token (PREFILL phase).",
    "request_decode_time_seconds": "Per finished request: first to last token (DECODE phase).",
    "request_inference_time_seconds": "Per finished request: first scheduled to last token (RUNNING phase).",
    "iteration_tokens_total": "Tokens per engine step (prompt chunks and decode tokens, drafts included).",
}


class EngineMetrics:
    """One registry per server; label ``model_name`` as vLLM does."""

    def __init__(self, engine: "EngineClient", model_name: str) -> None:
        """``engine``: in-thread or in another process; either has ``snapshot()`` and
        ``add_stats_listener()`` (the process engine replays the core's events)."""
        self.registry = CollectorRegistry()
        self.engine = engine
        self.model_name = model_name
        lab = ["model_name"]
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.", lab,
                              buckets=TTFT_BUCKETS, registry=self.registry).labels(model_name)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between output tokens.", lab,
                             buckets=ITL_BUCKETS, registry=self.registry).labels(model_name)
        # vLLM's older name for the same observations, kept there as a deprecated alias
        self.tpot = Histogram("vllm:time_per_output_token_seconds",
                              "Time per output token. DEPRECATED: use vllm:inter_token_latency_seconds.", lab,
                              buckets=TPOT_BUCKETS, registry=self.registry).labels(model_name)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.", lab,
                             buckets=E2E_BUCKETS, registry=self.registry).labels(model_name)
        self.queue = Histogram("vllm:request_queue_time_seconds", "Time spent waiting before scheduling.",
                               lab, buckets=E2E_BUCKETS, registry=self.registry).labels(model_name)
        self.registry.register(_EngineCollector(self))
        engine.add_stats_listener(self)

    # StatsListener -------------------------------------------------------------------
    def on_scheduled(self, queue_time: float) -> None:
        self.queue.observe(queue_time)

    def on_first_token(self, ttft: float) -> None:
        self.ttft.observe(ttft)

    def on_tokens(self, n: int, gap: float | None) -> None:
        if gap is not None and n > 0:
            self.itl.observe(gap / n)
            self.tpot.observe(gap / n)

    def on_finished(self, reason: str, e2e: float, prompt_tokens: int, output_tokens: int) -> None:
        if reason in ("stop", "length"):  # an abort or an error is no request latency
            self.e2e.observe(e2e)


class _EngineCollector:
    def __init__(self, m: EngineMetrics) -> None:
        self.m = m

    def collect(self) -> Iterable[Metric]:
        snap, name = self.m.engine.snapshot(), self.m.model_name

        def gauge(metric: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(metric, doc, labels=["model_name"])
            g.add_metric([name], value)
            return g

        def counter(metric: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(metric, doc, labels=["model_name"])
            c.add_metric([name], value)
            return c

        if not snap:
            return
        yield gauge("vllm:num_requests_running", "Requests in the running batch.", snap["num_running"])
        yield gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", snap["num_waiting"])
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage (1 = full).", snap["kv_cache_usage"])
        yield gauge("vllm:gpu_cache_usage_perc", "KV-cache usage (1 = full). DEPRECATED: use "
                    "vllm:kv_cache_usage_perc (vLLM's older name, kept for dashboards).", snap["kv_cache_usage"])
        yield gauge("llmserve:busy_fraction", "Share of wall time in forward passes, recent window.",
                    snap["busy_fraction"])
        yield counter("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.", snap["prefix_cache_queries"])
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", snap["prefix_cache_hits"])
        yield counter("vllm:num_preemptions", "Cumulative preemptions.", snap["num_preemptions"])
        yield counter("vllm:prompt_tokens", "Prefill tokens processed.", snap["prompt_tokens"])
        yield counter("vllm:generation_tokens", "Generation tokens produced.", snap["generation_tokens"])
        ok = CounterMetricFamily("vllm:request_success", "Finished requests by finish reason.",
                                 labels=["model_name", "finished_reason"])
        for reason in ("stop", "length", "abort", "error"):
            ok.add_metric([name, reason], snap["finished"].get(reason, 0))
        yield ok
        yield from _snapshot_histograms(name, snap.get("histograms"), self.m.engine.max_model_len)
        if snap.get("cache_config"):
            yield _cache_config_info(snap["cache_config"])
        from llmserve.server.lora_api import lora_residency

        yield lora_residency(name, self.m.engine, snap)
        spec = snap["spec"]
        if spec is not None:
            drafts, draft_tokens, accepted, per_pos, rate_buckets, rate_sum = spec
            yield counter("vllm:spec_decode_num_drafts", "Speculative drafts proposed.", drafts)
            yield counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.", draft_tokens)
            yield counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.", accepted)
            per = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                      "Accepted draft tokens by position.", labels=["model_name", "position"])
            for i, n in enumerate(per_pos):
                per.add_metric([name, str(i)], n)
            yield per
            yield _request_rates(name, rate_buckets, rate_sum)


def _snapshot_histograms(name: str, hists: dict | None, max_model_len: int) -> Iterable[Metric]:
    """The engine's counts as vLLM's histograms; token counts keep the bounds up to
    max_model_len (vLLM's build_1_2_5_buckets), the rest fold into +Inf."""
    for key, (counts, total) in (hists or {}).items():
        bounds = HISTOGRAM_BOUNDS[key]
        keep = len(bounds)
        if bounds is TOKEN_BUCKETS:
            keep = sum(1 for b in bounds if b <= max_model_len)
        h = HistogramMetricFamily(f"vllm:{key}", _HIST_DOCS[key], labels=["model_name"])
        pairs, run = [], 0
        for b, n in zip(bounds[:keep], counts):
            run += n
            pairs.append((_le(b), run))
        pairs.append(("+Inf", sum(counts)))
        h.add_metric([name], pairs, total)
        yield h


def _le(b: float) -> str:
    return floatToGoString(b)  # how prometheus_client writes its own Histogram's bounds


def _cache_config_info(cfg: dict) -> GaugeMetricFamily:
    """vLLM's info gauge (1) whose labels are the cache config; no model_name label, as vLLM's."""
    labels = {k: str(v) for k, v in sorted(cfg.items())} | {"engine": "0"}
    g = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                          labels=list(labels))
    g.add_metric(list(labels.values()), 1.0)
    return g


def _request_rates(name: str, buckets: list[int], total: float) -> HistogramMetricFamily:
    """Finished requests that drafted, by their share of draft tokens accepted."""
    h = HistogramMetricFamily("llmserve:spec_decode_request_acceptance_rate",
                              "Per finished request that drafted: accepted / proposed draft tokens.",
                              labels=["model_name"])
    pairs = [(str(b), n) for b, n in zip(RATE_BUCKETS, buckets)] + [("+Inf", buckets[-1])]
    h.add_metric([name], pairs, total)
    return h
