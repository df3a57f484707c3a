"""Serving metrics from request records: pure functions, definitions identical to vLLM's.

``vllm bench serve`` is the yardstick users already read, so every number here is
computed the way ``vllm/benchmarks/serve.py::calculate_metrics`` computes it, which
makes a figure from ``llmserve bench`` comparable with one from vLLM:

- TTFT: time from sending the request to the first SSE event carrying a choice.
- ITL: gaps between consecutive choice-carrying events, pooled over all requests.
- e2e latency: time from sending to the last choice-carrying event.
- TPOT: ``(e2e - TTFT) / (output_tokens - 1)`` per request with more than one
  output token; output_tokens comes from the server's usage field when present.
- Token and request totals count successful requests only; input tokens are the
  dataset's prompt lengths; throughputs divide by the run's wall duration.
- Goodput: successful requests meeting every given SLO, per second; a request
  with at most one output token has TPOT 0 for this purpose.
- Percentiles use numpy's default (linear interpolation).

Failures are counted by kind and never folded into latency statistics.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np

from llmserve.bench.records import RequestRecord

SLO_KEYS = ("ttft", "tpot", "e2el")
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")  # the latencies a Summary holds


@dataclass(slots=True, frozen=True)
class SLO:
    """Per-request service-level objectives in milliseconds; None means not constrained."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def __post_init__(self) -> None:
        for key in SLO_KEYS:
            v = getattr(self, f"{key}_ms")
            if v is not None and not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"goodput SLO {key} must be a finite number of ms >= 0, got {v}")

    @property
    def is_empty(self) -> bool:
        return self.ttft_ms is None and self.tpot_ms is None and self.e2el_ms is None

    @classmethod
    def parse(cls, items: Iterable[str]) -> SLO:
        """Parse ``["ttft:500", "tpot:50"]`` (the ``--goodput`` syntax, values in ms)."""
        values: dict[str, float] = {}
        for item in items:
            key, sep, value = item.partition(":")
            key = key.strip().lower()
            if not sep or key not in SLO_KEYS:
                raise ValueError(f"goodput SLO {item!r}: expected KEY:MS with KEY in {SLO_KEYS}")
            try:
                values[f"{key}_ms"] = float(value)
            except ValueError:
                raise ValueError(f"goodput SLO {item!r}: {value!r} is not a number") from None
        return cls(**values)

    def to_dict(self) -> dict[str, float]:
        return {k: v for k in SLO_KEYS if (v := getattr(self, f"{k}_ms")) is not None}


# --- per-request metrics (seconds) -------------------------------------------------


def ttft(r: RequestRecord) -> float:
    return r.chunk_s[0]


def e2el(r: RequestRecord) -> float:
    return r.chunk_s[-1]


def itls(r: RequestRecord) -> list[float]:
    return [b - a for a, b in pairwise(r.chunk_s)]


def tpot(r: RequestRecord) -> float | None:
    """None for requests with at most one output token: TPOT is undefined there."""
    if r.output_tokens <= 1:
        return None
    return (e2el(r) - ttft(r)) / (r.output_tokens - 1)


def meets_slo(r: RequestRecord, slo: SLO) -> bool:
    if not r.success:
        return False
    checks = (
        (slo.ttft_ms, ttft(r)),
        (slo.tpot_ms, tpot(r) or 0.0),
        (slo.e2el_ms, e2el(r)),
    )
    return all(limit is None or limit / 1000.0 >= value for limit, value in checks)


# --- distributions -----------------------------------------------------------------


def percentile_key(p: float) -> str:
    """``p99``, ``p99.9``: the key vLLM writes in its JSON."""
    return f"p{int(p)}" if float(p).is_integer() else f"p{p}"


@dataclass(slots=True)
class LatencyStats:
    """Summary of one latency distribution, in milliseconds; all None when it is empty."""

    count: int
    mean_ms: float | None
    median_ms: float | None
    std_ms: float | None
    percentiles_ms: dict[str, float | None]

    @classmethod
    def of(cls, seconds: Sequence[float], percentiles: Sequence[float]) -> LatencyStats:
        if len(seconds) == 0:
            return cls(0, None, None, None, {percentile_key(p): None for p in percentiles})
        ms = np.asarray(seconds, dtype=np.float64) * 1000.0
        return cls(
            count=len(ms),
            mean_ms=float(np.mean(ms)),
            # numpy's linear interpolation, as vLLM's calculate_metrics (not the project's nearest
            # rank, llmserve.percentiles): a bench figure reads the same as vLLM's.
            median_ms=float(np.median(ms)),
            std_ms=float(np.std(ms)),
            percentiles_ms={percentile_key(p): float(np.percentile(ms, p)) for p in percentiles},
        )


@dataclass(slots=True)
class Summary:
    """Everything the end-of-run table shows; ``to_flat_dict`` uses vLLM's key names."""

    num_requests: int
    completed: int
    failed: int
    failures_by_kind: dict[str, int]
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    server_prompt_tokens: int | None
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    good_completed: int | None
    request_goodput: float | None
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2el: LatencyStats
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    max_in_flight: int
    output_sources: dict[str, int] = field(default_factory=dict)

    def to_flat_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "num_requests": self.num_requests,
            "completed": self.completed,
            "failed": self.failed,
            "failures_by_kind": dict(self.failures_by_kind),
            "duration": self.duration_s,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "server_prompt_tokens": self.server_prompt_tokens,
            "request_throughput": self.request_throughput,
            "request_goodput": self.request_goodput,
            "good_completed": self.good_completed,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "max_output_tokens_per_s": self.max_output_tokens_per_s,
            "max_concurrent_requests": self.max_concurrent_requests,
            "max_in_flight": self.max_in_flight,
            "output_token_sources": dict(self.output_sources),
        }
        for name in LATENCY_METRICS:
            s: LatencyStats = getattr(self, name)
            d[f"mean_{name}_ms"] = s.mean_ms
            d[f"median_{name}_ms"] = s.median_ms
            d[f"std_{name}_ms"] = s.std_ms
            for key, value in s.percentiles_ms.items():
                d[f"{key}_{name}_ms"] = value
        return d


def summarize(
    records: Sequence[RequestRecord],
    duration_s: float,
    percentiles: Sequence[float] = (90.0, 99.0),
    slo: SLO | None = None,
) -> Summary:
    """Aggregate records of one run (or one priority class of it) over ``duration_s``."""
    if duration_s <= 0:
        raise ValueError(f"duration must be positive, got {duration_s}")
    ok = [r for r in records if r.success]
    failures = Counter(r.failure_label for r in records if not r.success)
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    usage_prompts = [r.usage_prompt_tokens for r in ok]
    server_prompt = sum(usage_prompts) if ok and None not in usage_prompts else None
    good = None
    if slo is not None and not slo.is_empty:
        good = sum(meets_slo(r, slo) for r in ok)
    peak_tok, peak_conc = _peaks(ok)
    return Summary(
        num_requests=len(records),
        completed=len(ok),
        failed=len(records) - len(ok),
        failures_by_kind=dict(sorted(failures.items())),
        duration_s=duration_s,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        server_prompt_tokens=server_prompt,
        request_throughput=len(ok) / duration_s,
        output_throughput=total_out / duration_s,
        total_token_throughput=(total_in + total_out) / duration_s,
        good_completed=good,
        request_goodput=None if good is None else good / duration_s,
        ttft=LatencyStats.of([ttft(r) for r in ok], percentiles),
        tpot=LatencyStats.of([t for r in ok if (t := tpot(r)) is not None], percentiles),
        itl=LatencyStats.of([g for r in ok for g in itls(r)], percentiles),
        e2el=LatencyStats.of([e2el(r) for r in ok], percentiles),
        max_output_tokens_per_s=peak_tok,
        max_concurrent_requests=peak_conc,
        max_in_flight=max_in_flight(records),
        output_sources=dict(Counter(r.output_source.value for r in ok)),
    )


def summarize_by_priority(
    records: Sequence[RequestRecord],
    duration_s: float,
    percentiles: Sequence[float] = (90.0, 99.0),
    slo: SLO | None = None,
) -> dict[str, Summary]:
    """One summary per priority class, each over the whole run's duration."""
    classes = sorted({r.priority for r in records})
    return {
        c: summarize([r for r in records if r.priority == c], duration_s, percentiles, slo)
        for c in classes
    }


def _peaks(ok: Sequence[RequestRecord]) -> tuple[float, int]:
    """vLLM's peak figures: most chunks in a one-second bucket, and most requests
    active in any bucket, with buckets counted from the first request's start."""
    if not ok:
        return 0.0, 0
    t0 = min(r.start_s for r in ok)
    end = max(r.start_s + e2el(r) for r in ok)
    n = int(np.ceil(end - t0)) + 1
    tokens = np.zeros(n)
    active = np.zeros(n)
    for r in ok:
        for c in r.chunk_s:
            b = int(r.start_s + c - t0)
            if 0 <= b < n:
                tokens[b] += 1
        first, last = int(r.start_s - t0), int(r.start_s + e2el(r) - t0)
        active[first : last + 1] += 1
    return float(tokens.max()), int(active.max())


def max_in_flight(records: Sequence[RequestRecord]) -> int:
    """Most successful requests open at one instant (send to last chunk). Exact,
    unlike vLLM's ``max_concurrent_requests``, which counts every request that
    touches a one-second bucket, so sequential requests in one second count as many."""
    events = []
    for r in records:
        if r.success:
            events += [(r.start_s, 1), (r.start_s + e2el(r), -1)]
    events.sort(key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    peak = cur = 0
    for _, step in events:
        cur += step
        peak = max(peak, cur)
    return peak


def throughput_timeline(
    records: Sequence[RequestRecord], bucket_s: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bucket start times, output tokens/s, completed requests/s) of successful requests.

    A request's output tokens are spread evenly over its chunks: servers may pack
    several tokens into one chunk, and only the total (from usage) is exact.
    """
    ok = [r for r in records if r.success]
    if not ok:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    end = max(r.start_s + e2el(r) for r in ok)
    n = int(np.floor(end / bucket_s)) + 1
    tokens = np.zeros(n)
    done = np.zeros(n)
    for r in ok:
        per_chunk = r.output_tokens / len(r.chunk_s)
        for c in r.chunk_s:
            tokens[int((r.start_s + c) / bucket_s)] += per_chunk
        done[int((r.start_s + e2el(r)) / bucket_s)] += 1
    return np.arange(n) * bucket_s, tokens / bucket_s, done / bucket_s
