"""The iteration-level scheduler: a pure planner over requests and KV blocks.

Each step hands out a token budget ``{request_id: n}``. There is no prefill or
decode phase: a request needs ``num_tokens - num_computed_tokens`` tokens (plus any
draft tokens), and gets as many as the budget allows, so a long prompt is split
into chunks that share a forward pass with decoding requests. No torch, no I/O:
``schedule()`` plans, ``update_from_output()`` applies what the model produced.

A request whose own planning or update raises (a salt that cannot be hashed, say)
is failed alone: its blocks are freed, its status is ``FINISHED_ERROR`` with the
reason in ``Request.error``, and the step goes on with the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from llmserve.engine.kv_cache import KVCacheManager
from llmserve.engine.request import Request, RequestStatus
from llmserve.engine.scheduler_config import SchedulerConfig
from llmserve.engine.step_cost import StepCosts


@dataclass(slots=True)
class ScheduledRequest:
    request: Request
    num_tokens: int  # tokens of all_token_ids computed this step (spec tokens excluded)
    spec_token_ids: list[int]
    # True when this step reaches the end of the known tokens, so logits are sampled.
    sample: bool


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    failed: list[Request] = field(default_factory=list)  # failed alone while planning
    total_tokens: int = 0

    @property
    def empty(self) -> bool:
        return not self.scheduled


class _Planned(dict):
    """This step's scheduled requests by id, with running token totals so that every
    budget check is O(1) (a sum per candidate made a step quadratic in the batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0  # new + speculative tokens
        self.batch = 0  # new tokens of batch-class requests

    def _count(self, s: ScheduledRequest, sign: int) -> None:
        self.total += sign * (s.num_tokens + len(s.spec_token_ids))
        if s.request.is_batch_class:
            self.batch += sign * s.num_tokens

    def __setitem__(self, key: str, s: ScheduledRequest) -> None:
        if key in self:
            self._count(self[key], -1)
        super().__setitem__(key, s)
        self._count(s, +1)

    def pop(self, key: str, default=None):
        s = super().pop(key, None)
        if s is None:
            return default
        self._count(s, -1)
        return s


@dataclass(slots=True)
class _TimeBudget:
    """This step's seconds left for prompt chunks (decodes are reserved up front)."""

    costs: StepCosts
    left: float
    # Realtime prompts up to this long are not split: that only adds steps to their own TTFT.
    # With no request decoding or waiting none is: nobody waits on the step, and a long
    # prompt cut to fit the budget ran 2-7x slower alone (each chunk reads its whole context
    # again, memory-bound where a long chunk is compute-bound).
    long_prompt: int | float


class Scheduler:
    """Waiting and running queues, priority order, budget and preemption."""

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        self._tokens_by_class = [0.0, 0.0]  # decayed tokens: [realtime, batch]
        self._time: _TimeBudget | None = None  # set for the length of one schedule()

    # ---- queue management ------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a request; raises ValueError at once if it could never run."""
        cap = min(self.config.max_model_len, self.kv.token_capacity)
        need = request.num_prompt_tokens + request.max_tokens
        if request.num_prompt_tokens == 0:
            raise ValueError("the prompt is empty")
        if need > cap:
            raise ValueError(
                f"this request needs {need} tokens ({request.num_prompt_tokens} in the prompt + "
                f"{request.max_tokens} max_tokens) but at most {cap} fit "
                f"(max_model_len {self.config.max_model_len}, KV pool "
                f"{self.kv.num_blocks * self.kv.block_size} tokens)")
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id}")
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_request(self, request_id: str, status: RequestStatus) -> Request | None:
        """End a request from outside (stop string, abort); frees its blocks at once."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.status = status
        self.kv.free(req)
        return req

    def fail_request(self, request_id: str, error: str) -> Request | None:
        """End one request with an error (``FINISHED_ERROR``); None if it already finished."""
        req = self.finish_request(request_id, RequestStatus.FINISHED_ERROR)
        if req is not None:
            req.error = error
        return req

    @property
    def num_unfinished(self) -> int:
        return len(self.requests)

    # ---- planning ------------------------------------------------------------------
    def _order_key(self, batch_first: bool):
        def key(r: Request):
            cls = r.is_batch_class
            return ((0 if cls else 1) if batch_first else 0, r.priority, r.arrival_time)
        return key

    def _batch_starved(self) -> bool:
        share = self.config.batch_min_share
        if share <= 0.0:
            return False
        has_batch = any(r.is_batch_class for r in self.waiting) or any(r.is_batch_class for r in self.running)
        has_rt = any(not r.is_batch_class for r in self.waiting) or any(not r.is_batch_class for r in self.running)
        if not (has_batch and has_rt):
            return False
        rt, batch = self._tokens_by_class
        return batch < share * (rt + batch)

    def time_budget(self, costs: StepCosts | None) -> float | None:
        """Seconds a step with prompt tokens may last; None: no time limit."""
        c = self.config
        if costs is None or (c.step_time_budget_s is None and not c.step_budget_tokens):
            return None
        return c.step_time_budget_s or costs.step(c.step_budget_tokens, 0)

    def schedule(self, costs: StepCosts | None = None) -> SchedulerOutput:
        """Plan one step; ``costs`` (measured on this machine) turns on time-aware chunks."""
        budget_s = self.time_budget(costs)
        self._time = None
        if budget_s is not None:
            decodes = sum(1 for r in self.running if r.num_tokens - r.num_computed_tokens == 1)
            # Where decodes alone fill the budget, prompts still get half of it: the wait is long anyway.
            left = max(budget_s - costs.step(0, decodes), (budget_s - costs.base_s) / 2)
            waits = decodes or self.waiting
            long_prompt = 4 * costs.tokens_within(budget_s - costs.base_s, 0) if waits else math.inf
            self._time = _TimeBudget(costs, left, long_prompt)
        try:
            return self._schedule()
        finally:
            self._time = None

    def _schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        cap = self.config.max_num_batched_tokens
        starved = self._batch_starved()
        key = self._order_key(starved)
        scheduled = _Planned()
        # When batch work is owed its share, realtime requests leave this much budget.
        reserve = math.ceil(self.config.batch_min_share * cap) if starved else 0

        def avail(r: Request) -> int:
            left = cap - scheduled.total
            return left if r.is_batch_class else left - max(0, reserve - scheduled.batch)

        # One pass in priority order over running *and* waiting requests: a waiting
        # realtime request is served before the prompt chunks of running batch
        # requests, so it never waits behind them. Within a priority, running
        # requests go first: they already hold KV.
        order = sorted(self.running + self.waiting,
                       key=lambda r: (*key(r)[:2], r.status is not RequestStatus.RUNNING, r.arrival_time))
        admitting = True
        rt_prefill = False
        for req in order:
            if scheduled.total >= cap:
                break
            prefill = req.num_tokens - req.num_computed_tokens > 1
            if req.is_batch_class and prefill and rt_prefill and not starved:
                # A step that prefills a realtime prompt carries no batch prompt chunk:
                # it lasts as long as on an idle engine (batch decodes are cheap; stay).
                continue
            try:
                if req.status is RequestStatus.RUNNING:
                    self._schedule_running(req, avail(req), scheduled, out)
                elif admitting and not out.preempted:  # (a request preempted here is not re-admitted)
                    admitting = self._admit(req, avail(req), scheduled, out)
            except Exception as e:  # noqa: BLE001 - its own fault: it fails, the plan goes on
                scheduled.pop(req.request_id)
                self.fail_request(req.request_id, f"scheduling failed: {e}")
                out.failed.append(req)
                continue
            # Only a realtime prompt that got tokens this step holds batch chunks back.
            rt_prefill |= prefill and not req.is_batch_class and req.request_id in scheduled
            if prefill and self._time is not None and req.request_id in scheduled:
                self._time.left -= self._time.costs.prefill(scheduled[req.request_id].num_tokens,
                                                            req.num_computed_tokens)

        out.scheduled = list(scheduled.values())
        out.total_tokens = scheduled.total
        self._account(out)
        return out

    def _schedule_running(self, req: Request, budget: int, scheduled: dict, out: SchedulerOutput) -> None:
        """Give a running request its next tokens, preempting others if blocks run out."""
        n = self._chunk(req, req.num_tokens - req.num_computed_tokens, budget, req.num_computed_tokens)
        if n <= 0:
            return
        spec = req.spec_token_ids if n == req.num_tokens - req.num_computed_tokens else []
        spec = spec[:max(0, budget - n)]
        while not self.kv.allocate_slots(req, n + len(spec)):
            victim = self._pick_victim(exclude=None)
            if victim is req and spec:
                spec = []  # first try without the draft tokens
                continue
            self._preempt(victim, scheduled, out)
            if victim is req:
                return
        scheduled[req.request_id] = ScheduledRequest(req, n, list(spec), req.num_computed_tokens + n == req.num_tokens)

    def _admit(self, req: Request, budget: int, scheduled: dict, out: SchedulerOutput) -> bool:
        """Start a waiting request; False when it cannot start (admission stops there)."""
        if budget <= 0:
            return True  # out of budget for its class only: later classes may still fit
        loras = {r.lora_id for r in self.running if r.lora_id}
        if req.lora_id and req.lora_id not in loras and len(loras) >= self.config.max_loras:
            return True  # every adapter slot is taken by running requests: requests on those may still start
        if len(self.running) >= self.config.max_num_seqs and not self._preempt_for(req, scheduled, out):
            return False
        hits, num_hit = self.kv.get_computed_blocks(req) if req.num_computed_tokens == 0 else ([], 0)
        n = self._chunk(req, req.num_tokens - num_hit, budget, num_hit)
        saved = req.num_computed_tokens
        req.num_computed_tokens = num_hit
        ok = self.kv.allocate_slots(req, n, new_computed_blocks=hits, admitting=True)
        if not ok and self._preempt_for(req, scheduled, out):
            ok = self.kv.allocate_slots(req, n, new_computed_blocks=hits, admitting=True)
        if not ok:
            req.num_computed_tokens = saved
            return False  # keep priority order: do not let later requests jump ahead
        self.kv.record_prefix_lookup(req.num_tokens, num_hit)
        if req.num_preemptions == 0:
            req.num_cached_tokens = num_hit
        self.waiting.remove(req)
        self.running.append(req)
        req.status = RequestStatus.RUNNING
        scheduled[req.request_id] = ScheduledRequest(req, n, [], num_hit + n == req.num_tokens)
        return True

    def _chunk(self, req: Request, remaining: int, budget: int, start: int) -> int:
        cap = self.config.long_prefill_token_threshold
        n = min(remaining, budget)
        if n <= 1:
            return n
        if cap:
            n = min(n, cap)
        tb = self._time
        if tb is not None and (req.is_batch_class or req.num_tokens > tb.long_prompt):  # (a long one's tail too)
            fits = tb.costs.tokens_within(tb.left, start)
            n = min(n, max(self.config.min_chunk_tokens, fits))
        return n

    def _account(self, out: SchedulerOutput) -> None:
        d = self.config.share_decay
        rt = sum(s.num_tokens for s in out.scheduled if not s.request.is_batch_class)
        b = out.total_tokens - rt
        self._tokens_by_class = [self._tokens_by_class[0] * d + rt, self._tokens_by_class[1] * d + b]

    def _pick_victim(self, exclude: Request | None) -> Request:
        """Lowest priority first (largest number), then the latest arrival."""
        cands = [r for r in self.running if r is not exclude]
        return max(cands, key=lambda r: (r.priority, r.arrival_time))

    def _preempt_for(self, req: Request, scheduled: dict, out: SchedulerOutput) -> bool:
        """Preempt one running request of strictly lower priority than ``req``, if any."""
        lower = [r for r in self.running if r.priority > req.priority]
        if not lower:
            return False
        self._preempt(max(lower, key=lambda r: (r.priority, r.arrival_time)), scheduled, out)
        return True

    def _preempt(self, victim: Request, scheduled: dict, out: SchedulerOutput) -> None:
        self.running.remove(victim)
        scheduled.pop(victim.request_id, None)
        self.kv.free(victim)
        victim.num_computed_tokens = 0
        victim.spec_token_ids = []
        victim.status = RequestStatus.PREEMPTED
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.insert(0, victim)
        out.preempted.append(victim)

    # ---- applying the model's output -------------------------------------------------
    def update_from_output(self, out: SchedulerOutput,
                           sampled: dict[str, list[int]]) -> list[Request]:
        """Append sampled tokens, advance computed counts, finish and free.

        ``sampled[request_id]`` holds the tokens produced for a request that sampled
        this step: the accepted draft tokens followed by one new token. Returns the
        requests that finished, those that failed (``FINISHED_ERROR``) included.
        """
        finished = []
        for s in out.scheduled:
            req = s.request
            if req.is_finished or req.status is not RequestStatus.RUNNING:
                continue
            try:
                status = self._apply(req, s, sampled)
            except Exception as e:  # noqa: BLE001 - its own fault: it fails, the others are applied
                self.fail_request(req.request_id, f"applying the step failed: {e}")
                finished.append(req)
                continue
            if status is not None:
                self.finish_request(req.request_id, status)
                finished.append(req)
        return finished

    def _apply(self, req: Request, s: ScheduledRequest, sampled: dict[str, list[int]]) -> RequestStatus | None:
        """Advance one request by what this step computed and sampled; the status it ends with, if any."""
        req.num_computed_tokens += s.num_tokens
        req.spec_token_ids = []
        if s.sample:
            new = sampled.get(req.request_id, [])
            # Accepted drafts already have KV: count them as computed.
            req.num_computed_tokens += max(0, len(new) - 1)
            status = self._append(req, new)
            # A stop inside the accepted drafts cuts the tokens short: never count
            # KV for tokens that are not in the sequence.
            req.num_computed_tokens = min(req.num_computed_tokens, req.num_tokens - 1)
            if status is not None:
                self.kv.cache_computed_blocks(req)  # reusable by the next turn of a chat
                return status
            # Drop blocks reserved for drafts that were rejected.
            self.kv.trim(req, req.num_tokens)
        self.kv.cache_computed_blocks(req)
        return None

    def _append(self, req: Request, new: list[int]) -> RequestStatus | None:
        sp = req.sampling_params
        for tok in new:
            req.all_token_ids.append(tok)
            if (tok in req.eos_token_ids and not sp.ignore_eos) or tok in sp.stop_token_ids:
                req.stop_reason = tok if tok in sp.stop_token_ids else None
                return RequestStatus.FINISHED_STOPPED
            if req.num_output_tokens >= req.max_tokens or req.num_tokens >= self.config.max_model_len:
                return RequestStatus.FINISHED_LENGTH
        return None
