"""A simulated engine instance: continuous batching, advanced a run of steps at a time.

The engine schedules like llmserve's own scheduler: each step every running
sequence that has its prompt computed decodes one token, the rest of the token
budget goes to prompt chunks (running sequences first, then waiting requests
admitted while the batch has seats and the KV cache has room), and a sequence
gets its first token in the step that finishes its prompt.

Simulating a day step by step would mean tens of millions of events. Between
"interesting" moments (a prompt chunk, a request arriving, a sequence
finishing) the batch is a fixed set of decoding sequences whose contexts grow by
one token per step, so the time of k steps is an arithmetic series:
``T(k) = k*(a + c*n + d*C0) + d*n*k*(k-1)/2``. A decode *segment* therefore runs
up to the next completion in one event; a request arriving mid-segment cuts
it at the next step boundary (solving ``T(j) <= elapsed`` for j), exactly where
the real engine would have admitted it.

KV capacity is reserved per sequence for its prompt plus output when admitted,
so no preemption is modelled: the scheduler simply admits fewer.

With a profile's core sharing (:mod:`llmserve.sim.sharing`), instances share
one :class:`~llmserve.sim.sharing.BusyInstances` tally, and each segment's steps
are stretched by the slowdown for the instances busy when it is planned (one
that becomes busy or idle mid-segment changes the next segment, not this one).

The batch is kept as running totals rather than walked per step: every decoding
sequence gains one token per step, so one step counter stands for all of them
(a sequence's tokens are the counter minus its start), the batch's context is a
sum kept as sequences join and leave, and the next completion is the top of a
heap. A step costs the work of what changed in it (prompt chunks, first tokens,
completions), not of the batch's size; the outcomes are those of the loop
over every sequence it replaces (``tests/sim/test_golden_outcomes.py``).
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from llmserve.lifecycle import InstanceState
from llmserve.sim.adapters import Resident
from llmserve.sim.profile import InstanceProfile
from llmserve.sim.sharing import BusyInstances

IDLE, PENDING, MIXED, DECODE = 0, 1, 2, 3


class Seq:
    """One request inside an engine; ``done_at`` is the instance's step count at which it
    has all its output (set when its prompt is computed), ``order`` its place in the batch."""

    __slots__ = ("rid", "prompt", "output", "prefilled", "chunk", "done_at", "order")

    def __init__(self, rid: int, prompt: int, output: int) -> None:
        self.rid = rid
        self.prompt = prompt
        self.output = output
        self.prefilled = 0
        self.chunk = 0
        self.done_at = 0
        self.order = 0


class SimInstance:
    """One instance's engine state and its current segment of steps.

    The simulator owns the event heap: after any call that returns True it
    (re)schedules the instance's segment end at ``seg_end`` with ``version``;
    events carrying an older version are stale and dropped.
    """

    __slots__ = ("id", "profile", "state", "since", "created", "stopped_at", "reason", "capacity_class", "replaces",
                 "reclaim_at", "drain_started", "ready_at", "exit_code", "running", "waiting",
                 "kv_reserved", "kind", "seg_start", "seg_steps", "seg_end", "seg_n", "seg_ctx0",
                 "version", "tokens_total", "gen_total", "busy_total", "first_tokens", "finished", "cores", "_a", "_b",
                 "_c", "_d", "_prefilling", "_steps", "_dec_n", "_dec_ctx", "_done", "_admitted", "adapters", "held")

    def __init__(self, iid: int, profile: InstanceProfile, now: float, state: InstanceState,
                 cores: BusyInstances | None = None, max_adapters: int | None = None) -> None:
        self.id = iid
        self.profile = profile
        self.state = state
        self.since = now
        self.created = now
        self.stopped_at: float | None = None
        # The record the simulator's InstanceBook keeps, as the live controller's:
        self.reason = ""
        self.capacity_class = "on_demand"
        self.replaces: int | None = None
        self.reclaim_at: float | None = None  # when the provider takes it (a reclaim notice)
        self.drain_started: float | None = None
        self.ready_at: float | None = None
        self.exit_code: int | None = None
        self.running: dict[int, Seq] = {}  # by order of admission, as the engine's batch
        self.waiting: deque[Seq] = deque()
        self.kv_reserved = 0
        self.kind = IDLE
        self.seg_start = self.seg_end = now
        self.seg_steps = self.seg_n = self.seg_ctx0 = 0
        self.version = 0
        self.tokens_total = 0
        self.gen_total = 0
        self.busy_total = 0.0
        self.first_tokens: list[Seq] = []
        self.finished: list[Seq] = []
        self.cores = cores
        self.adapters = Resident(max_adapters)
        self.held: list[Seq] = []  # routed here, waiting for their adapter's load
        self._prefilling: list[Seq] = []  # running, prompt not yet computed, in batch order
        self._steps = 0  # steps taken: each decoding sequence has this minus its start tokens
        self._dec_n = 0  # decoding sequences
        self._dec_ctx = 0  # their prompts minus their starts: context = this + n * steps
        self._done: list[tuple[int, int, Seq]] = []  # (done_at, order, seq) of decoding sequences
        self._admitted = 0
        self._time_steps(1.0)

    def _time_steps(self, slowdown: float) -> None:
        """Step coefficients for the next segment: the profile's, stretched by core sharing."""
        s = self.profile.step
        self._a, self._b = s.base_s * slowdown, s.per_prefill_token_s * slowdown
        self._c, self._d = s.per_decode_seq_s * slowdown, s.per_context_token_s * slowdown

    def _mark(self, busy: bool) -> None:
        if self.cores is not None:
            self.cores.mark(self.id, busy)
            if busy:
                self._time_steps(self.cores.slowdown())

    # ---- lifecycle (its state is moved by the simulator's InstanceBook) -------------------
    def moved(self, old: InstanceState, new: InstanceState, now: float) -> None:
        """Heard after each transition: a stopped instance is billed no more, busy no more."""
        if not new.billed:
            self.stopped_at = now
            self._mark(False)

    def cut(self) -> list[Seq]:
        """Everything on it, taken away at once (a reclaim's deadline): its segment is stale."""
        gone = [*self.running.values(), *self.waiting, *self.held]
        self.running.clear()
        self.waiting.clear()
        self.held.clear()
        self._prefilling.clear()
        self._done.clear()
        self._dec_n = self._dec_ctx = 0
        self.kv_reserved = 0
        self.version += 1
        return gone

    @property
    def in_flight(self) -> int:
        return len(self.running) + len(self.waiting) + len(self.held)

    # ---- requests in -----------------------------------------------------------------
    def add(self, seq: Seq, now: float) -> bool:
        """Queue a request; True when the segment changed and must be (re)scheduled."""
        self.waiting.append(seq)
        if self.kind == IDLE:
            return self.plan(now)
        if self.kind == DECODE and self._can_admit(self.waiting[0]):
            done = self._steps_done(now - self.seg_start)
            self._commit_decode(done)
            if self.seg_steps >= 1:
                self.seg_steps = 1
                self.seg_end = self.seg_start + self._decode_time(1)
                self.version += 1
                return True
        return False

    def _can_admit(self, seq: Seq) -> bool:
        return (len(self.running) < self.profile.max_num_seqs
                and self.kv_reserved + seq.prompt + seq.output <= self.profile.kv_capacity_tokens)

    # ---- decode segments ---------------------------------------------------------------
    def _decode_time(self, k: int) -> float:
        n = self.seg_n
        return k * (self._a + self._c * n + self._d * self.seg_ctx0) + self._d * n * k * (k - 1) / 2

    def _steps_done(self, elapsed: float) -> int:
        """Whole steps of the current decode segment finished within ``elapsed`` seconds."""
        if elapsed <= 0:
            return 0
        n = self.seg_n
        lin = self._a + self._c * n + self._d * self.seg_ctx0
        quad = self._d * n / 2
        if quad > 0:
            b = lin - quad
            j = int((-b + math.sqrt(b * b + 4 * quad * elapsed)) / (2 * quad))
        else:
            j = int(elapsed / lin)
        j = min(max(j, 0), self.seg_steps)
        while j > 0 and self._decode_time(j) > elapsed + 1e-12:
            j -= 1
        while j < self.seg_steps and self._decode_time(j + 1) <= elapsed + 1e-12:
            j += 1
        return j

    def _commit_decode(self, k: int) -> None:
        """Apply the first ``k`` steps of the decode segment."""
        if k <= 0:
            return
        dt = self._decode_time(k)
        self._steps += k
        n = self.seg_n
        self.tokens_total += n * k
        self.gen_total += n * k
        self.busy_total += dt
        self.seg_start += dt
        self.seg_ctx0 += n * k
        self.seg_steps -= k

    def sync(self, now: float) -> None:
        """Account the decode steps finished by ``now`` (for a load report); timing unchanged."""
        if self.kind == DECODE:
            self._commit_decode(self._steps_done(now - self.seg_start))

    def _decoding(self, s: Seq) -> None:
        """``s`` has its first token (one generated) as of the current step count."""
        s.done_at = self._steps - 1 + s.output
        self._dec_n += 1
        self._dec_ctx += s.prompt - (self._steps - 1)
        heapq.heappush(self._done, (s.done_at, s.order, s))

    # ---- segment end and planning --------------------------------------------------------
    def end_segment(self, now: float) -> None:
        """Apply the segment that ends now; fills ``first_tokens`` and ``finished``."""
        first, done = self.first_tokens, self.finished
        if self.kind == DECODE:
            self._commit_decode(self.seg_steps)
        elif self.kind == MIXED:
            decode = self._dec_n
            self._steps += 1  # every decoding sequence's token
            prefill = firsts = 0
            still: list[Seq] = []
            for s in self._prefilling:
                if s.chunk:
                    prefill += s.chunk
                    s.prefilled += s.chunk
                    s.chunk = 0
                    if s.prefilled == s.prompt:
                        firsts += 1
                        first.append(s)
                        self._decoding(s)
                        continue
                if s.output <= 0:  # nothing to generate: over with the step that admitted it
                    done.append(s)
                    continue
                still.append(s)
            self._prefilling = still
            self.tokens_total += prefill + decode + firsts
            self.gen_total += decode + firsts
            self.busy_total += now - self.seg_start
        heap, steps = self._done, self._steps
        while heap and heap[0][0] <= steps:
            s = heapq.heappop(heap)[2]
            self._dec_n -= 1
            self._dec_ctx -= s.prompt - (s.done_at - s.output)
            done.append(s)
        if done:
            if len(done) > 1:
                done.sort(key=lambda s: s.order)  # the batch's order, as the engine walks it
            running = self.running
            for s in done:
                del running[s.order]
                self.kv_reserved -= s.prompt + s.output
        self.kind = PENDING

    def plan(self, now: float) -> bool:
        """Choose the next segment; True when one was scheduled (False: idle)."""
        running = self.running
        budget = self.profile.max_num_batched_tokens
        if not self._prefilling and not (self.waiting and self._can_admit(self.waiting[0])):
            if not running:
                self.kind = IDLE
                self._mark(False)
                return False
            self._mark(True)
            self.kind = DECODE
            self.seg_start = now
            self.seg_n = self._dec_n
            self.seg_ctx0 = self._dec_ctx + self._dec_n * self._steps
            self.seg_steps = self._done[0][0] - self._steps
            self.seg_end = now + self._decode_time(self.seg_steps)
            self.version += 1
            return True

        self._mark(True)
        decode = self._dec_n
        ctx = self._dec_ctx + decode * self._steps
        prefill = 0
        budget -= decode
        for s in self._prefilling:
            if budget <= 0:
                break
            s.chunk = min(s.prompt - s.prefilled, budget)
            budget -= s.chunk
            prefill += s.chunk
            ctx += s.prefilled + s.chunk
        waiting = self.waiting
        while budget > 0 and waiting and self._can_admit(waiting[0]):
            s = waiting.popleft()
            s.order = self._admitted
            self._admitted += 1
            running[s.order] = s
            self._prefilling.append(s)
            self.kv_reserved += s.prompt + s.output
            s.chunk = min(s.prompt, budget)
            budget -= s.chunk
            prefill += s.chunk
            ctx += s.chunk
        self.kind = MIXED
        self.seg_start = now
        self.seg_end = now + self._a + self._b * prefill + self._c * decode + self._d * ctx
        self.version += 1
        return True

    # ---- load report numbers ------------------------------------------------------------
    @property
    def kv_usage(self) -> float:
        return min(1.0, self.kv_reserved / self.profile.kv_capacity_tokens)
