"""Engine counters and recent-window rates (busy fraction, tokens/s).

The server's Prometheus layer subscribes as a listener; the ``/load`` report reads
``window()``. Plain Python, no locks: only the engine thread writes.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Protocol

from llmserve.engine.step_cost import StepCostModel, StepCosts


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

    def step_costs(self) -> StepCosts:
        return self.cost_model.costs()

    def cost_report(self) -> dict[str, float] | None:
        """The fitted step costs once a step was measured (None before: a prior says nothing)."""
        if self.cost_model.observed == 0:
            return None
        c = self.cost_model.costs()
        return {"base_s": c.base_s, "prefill_token_s": c.prefill_token_s, "decode_seq_s": c.decode_seq_s}

    def on_first_scheduled(self, req, now: float) -> None:
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
        self._steps.append((t0, t1, plan.total_tokens, gen))
        cutoff = t1 - self.window_s
        while self._steps and self._steps[0][1] < cutoff:
            self._steps.popleft()

    def on_first_token(self, req, now: float) -> None:
        # vLLM's meaning: every prompt token of a request, cached or computed.
        self.prompt_tokens += req.num_prompt_tokens
        for lst in self.listeners:
            lst.on_first_token(now - req.arrival_time)

    def on_tokens(self, req, n: int, now: float) -> None:
        self.generation_tokens += n
        prev = self._last_token_time.get(req.request_id)
        self._last_token_time[req.request_id] = now
        for lst in self.listeners:
            lst.on_tokens(n, None if prev is None else now - prev)

    def on_finished(self, req, reason: str | None, metrics) -> None:
        reason = reason or "abort"
        self.finished[reason] = self.finished.get(reason, 0) + 1
        self._last_token_time.pop(req.request_id, None)
        e2e = (metrics.finished_time or time.monotonic()) - metrics.arrival_time
        for lst in self.listeners:
            lst.on_finished(reason, e2e, req.num_prompt_tokens, req.num_output_tokens)

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
    return {
        "num_running": len(sch.running),
        "num_waiting": len(sch.waiting),
        "num_waiting_by_priority": by_prio,
        "kv_cache_usage": kv.usage,
        "max_num_seqs": max_num_seqs,
        "prefix_cache_queries": kv.prefix_queries,
        "prefix_cache_hits": kv.prefix_hits,
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
            "spec": None if spec is None else [spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens,
                                               list(spec.accepted_per_pos),
                                               list(spec.counters.request_rate_buckets),
                                               spec.counters.request_rate_sum]}
