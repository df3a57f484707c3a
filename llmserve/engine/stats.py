"""Engine counters and recent-window rates (busy fraction, tokens/s).

The server's Prometheus layer subscribes as a listener; the ``/load`` report reads
``window()``. Plain Python, no locks: only the engine thread writes.

Per-request histograms (phases, token counts, max_tokens) and tokens per step are
counted here into vLLM's buckets and cross to the API process in the snapshot, like
the counters. The instance's warm-up requests (ids ``warmup-*``) count in none of the
client-facing figures: a fresh instance would otherwise show finished requests,
tokens and a TTFT nobody asked for. They still feed the step-cost fit and the busy
window, which is what the warm-up is for.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from typing import Any, Protocol

from llmserve.engine.step_cost import StepCostModel, StepCosts

WARMUP_ID_PREFIX = "warmup-"  # the ids server/app.py gives its warm-up requests

# vLLM's buckets (vllm/v1/metrics/loggers.py). Token counts use its 1-2-5 series; the
# /metrics layer keeps the bounds up to max_model_len, as vLLM builds them.
TOKEN_BUCKETS = tuple(m * 10 ** e for e in range(8) for m in (1, 2, 5))
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# name -> bounds of the histograms counted here (the snapshot's "histograms" key)
HISTOGRAM_BOUNDS: dict[str, tuple[float, ...]] = {
    "request_prompt_tokens": TOKEN_BUCKETS, "request_generation_tokens": TOKEN_BUCKETS,
    "request_params_max_tokens": TOKEN_BUCKETS, "request_time_per_output_token_seconds": TPOT_BUCKETS,
    "request_prefill_time_seconds": REQUEST_LATENCY_BUCKETS, "request_decode_time_seconds": REQUEST_LATENCY_BUCKETS,
    "request_inference_time_seconds": REQUEST_LATENCY_BUCKETS, "iteration_tokens_total": ITERATION_TOKEN_BUCKETS,
}


def is_warmup(req) -> bool:
    return req.request_id.startswith(WARMUP_ID_PREFIX)


class Hist:
    """Counts per bucket (not cumulative; the last is above every bound) and the sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds, self.counts, self.sum = bounds, [0] * (len(bounds) + 1), 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1  # Prometheus' le: v <= bound
        self.sum += v


class StatsListener(Protocol):
    def on_scheduled(self, queue_time: float) -> None: ...
    def on_first_token(self, ttft: float) -> None: ...
    def on_tokens(self, n: int, gap: float | None) -> None: ...
    def on_finished(self, reason: str, e2e: float, prompt_tokens: int, output_tokens: int) -> None: ...


class EngineStats:
    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: dict[str, int] = {}
        self.num_steps = 0
        self._steps: deque[tuple[float, float, int, int]] = deque()  # start, end, tokens, generated
        self._last_token_time: dict[str, float] = {}
        self.listeners: list[StatsListener] = []
        # (prefill_tokens, decode_seqs, sum_context, seconds) per step, when a
        # calibration run asks for it (``llmserve calibrate``).
        self.step_log: list[tuple[int, int, int, float]] | None = None
        self.cost_model = StepCostModel()  # what the scheduler sizes prompt chunks by
        self.hists = {name: Hist(b) for name, b in HISTOGRAM_BOUNDS.items()}
        self.warmup_prefix = [0, 0]  # prefix-cache tokens queried, hit by warm-up requests

    def step_costs(self) -> StepCosts:
        return self.cost_model.costs()

    def cost_report(self) -> dict[str, float] | None:
        """The fitted step costs once a step was measured (None before: a prior says nothing)."""
        if self.cost_model.observed == 0:
            return None
        c = self.cost_model.costs()
        return {"base_s": c.base_s, "prefill_token_s": c.prefill_token_s, "decode_seq_s": c.decode_seq_s}

    def on_first_scheduled(self, req, now: float) -> None:
        if is_warmup(req):  # its lookup is already counted by the KV manager: taken back out at snapshot
            self.warmup_prefix[0] += req.num_tokens
            self.warmup_prefix[1] += req.num_cached_tokens
            return
        for lst in self.listeners:
            lst.on_scheduled(now - req.arrival_time)

    def on_step(self, t0: float, t1: float, plan) -> None:
        self.num_steps += 1
        decodes = prefill = start = drafts = 0
        for x in plan.scheduled:
            if x.request.num_computed_tokens == x.request.num_tokens - 1:
                decodes += 1
                drafts += len(x.spec_token_ids)
            else:
                prefill += x.num_tokens
                start += x.num_tokens * x.request.num_computed_tokens
        self.cost_model.observe(prefill, decodes, start // prefill if prefill else 0, t1 - t0, drafts)
        if self.step_log is not None:
            ctx = sum(x.request.num_tokens for x in plan.scheduled
                      if x.request.num_computed_tokens == x.request.num_tokens - 1)
            self.step_log.append((prefill, decodes, ctx, t1 - t0))
        gen = sum(1 for s in plan.scheduled if s.sample)
        if not all(is_warmup(x.request) for x in plan.scheduled):
            self.hists["iteration_tokens_total"].observe(plan.total_tokens)
        self._steps.append((t0, t1, plan.total_tokens, gen))
        cutoff = t1 - self.window_s
        while self._steps and self._steps[0][1] < cutoff:
            self._steps.popleft()

    def on_first_token(self, req, now: float) -> None:
        if is_warmup(req):
            return
        # vLLM's meaning: every prompt token of a request, cached or computed.
        self.prompt_tokens += req.num_prompt_tokens
        for lst in self.listeners:
            lst.on_first_token(now - req.arrival_time)

    def on_tokens(self, req, n: int, now: float) -> None:
        if is_warmup(req):
            return
        self.generation_tokens += n
        prev = self._last_token_time.get(req.request_id)
        self._last_token_time[req.request_id] = now
        for lst in self.listeners:
            lst.on_tokens(n, None if prev is None else now - prev)

    def on_finished(self, req, reason: str | None, metrics) -> None:
        if is_warmup(req):
            return
        reason = reason or "abort"
        if reason in ("stop", "length"):  # an abort or an error has no phases to tell (as e2e in /metrics)
            self._phases(req, metrics)
        self.finished[reason] = self.finished.get(reason, 0) + 1
        self._last_token_time.pop(req.request_id, None)
        e2e = (metrics.finished_time or time.monotonic()) - metrics.arrival_time
        for lst in self.listeners:
            lst.on_finished(reason, e2e, req.num_prompt_tokens, req.num_output_tokens)

    def _phases(self, req, m) -> None:
        """vLLM's per-request histograms: prefill = first scheduled to first token, decode =
        first to last token, inference = both, and decode per output token after the first."""
        h = self.hists
        h["request_prompt_tokens"].observe(req.num_prompt_tokens)
        h["request_generation_tokens"].observe(req.num_output_tokens)
        if req.sampling_params.max_tokens is not None:  # (None: up to the context, as vLLM skips it)
            h["request_params_max_tokens"].observe(req.sampling_params.max_tokens)
        if m.first_scheduled_time is None or m.first_token_time is None:
            return
        last = m.last_token_time or m.first_token_time
        decode = last - m.first_token_time
        h["request_prefill_time_seconds"].observe(m.first_token_time - m.first_scheduled_time)
        h["request_decode_time_seconds"].observe(decode)
        h["request_inference_time_seconds"].observe(last - m.first_scheduled_time)
        n = req.num_output_tokens
        h["request_time_per_output_token_seconds"].observe(decode / (n - 1) if n > 1 else 0.0)

    def window(self, now: float | None = None) -> dict[str, Any]:
        """Busy fraction and throughput over the last ``window_s`` seconds."""
        now = time.monotonic() if now is None else now
        start = now - self.window_s
        busy = tokens = gen = 0.0
        for t0, t1, n, g in self._steps:
            if t1 < start:
                continue
            busy += t1 - max(t0, start)
            tokens += n
            gen += g
        span = self.window_s
        return {"busy_fraction": min(1.0, busy / span), "tokens_per_s": tokens / span,
                "generation_tokens_per_s": gen / span}


def load_snapshot(sch, kv, max_num_seqs: int, stats: EngineStats) -> dict[str, Any]:
    """The ``/load`` report: queues, KV use, prefix-cache hits and the recent window."""
    by_prio: dict[str, int] = {}
    for r in sch.waiting:
        by_prio[str(r.priority)] = by_prio.get(str(r.priority), 0) + 1
    # the warm-up's lookups are no client's (counted only where the KV manager counts)
    wq, wh = stats.warmup_prefix if kv.enable_prefix_caching else (0, 0)
    return {
        "num_running": len(sch.running),
        "num_waiting": len(sch.waiting),
        "num_waiting_by_priority": by_prio,
        "kv_cache_usage": kv.usage,
        "max_num_seqs": max_num_seqs,
        "prefix_cache_queries": kv.prefix_queries - wq,
        "prefix_cache_hits": kv.prefix_hits - wh,
        "num_preemptions": sch.num_preemptions,
        # The fitted step model: what the autoscaler turns into this instance's capacity.
        "step_costs": stats.cost_report(),
        **stats.window(),
    }


def core_snapshot(core) -> dict[str, Any]:
    """Everything /load and /metrics read from a core, as plain data (it crosses a process)."""
    spec = core.spec
    return {**core.load_snapshot(), "prompt_tokens": core.stats.prompt_tokens,
            "generation_tokens": core.stats.generation_tokens, "finished": dict(core.stats.finished),
            "histograms": {k: [list(h.counts), h.sum] for k, h in core.stats.hists.items()},
            "cache_config": {"block_size": core.kv.block_size, "num_gpu_blocks": core.kv.num_blocks,
                             "enable_prefix_caching": core.kv.enable_prefix_caching,
                             "cache_dtype": core.config.kv_cache_dtype},
            "spec": None if spec is None else [spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens,
                                               list(spec.accepted_per_pos),
                                               list(spec.counters.request_rate_buckets),
                                               spec.counters.request_rate_sum]}
