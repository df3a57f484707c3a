"""The discrete-event capacity simulator: one pool, one policy, one trace.

Events on a heap, a simulated clock, and llmserve's own decision code at every
decision point:

- requests arrive (read in order from the trace, merged with the heap) and go
  through the real admission queues and balancer (:mod:`llmserve.sim.gateway`);
- instances run continuous batching a segment of steps at a time
  (:mod:`llmserve.sim.instance`);
- every ``tick_s`` the controller builds :class:`PoolSignals` with the real
  :class:`~llmserve.autoscale.collector.SignalCollector` and takes the live
  controller's own :func:`~llmserve.autoscale.scaling_step.scaling_step` (policy
  stack, override, plan), and the live :class:`~llmserve.autoscale.executor.Executor`
  carries out its effects (:mod:`llmserve.autoscale.effects`) on an
  :class:`~llmserve.autoscale.book.InstanceBook` of simulated instances; only
  what backs them is simulated (:mod:`llmserve.sim.provider`); a draining
  instance stops only once its last request has finished.

Instance-hours are billed from an instance's start until it stops, over the
trace's duration; requests still in flight when the trace ends are run to
completion so that every request ends exactly once.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from llmserve.autoscale import AutoscaleConfig, build_policy
from llmserve.autoscale.collector import (CHARS_PER_TOKEN, LATENCY_WINDOW_S, OUTPUT_TOKENS_PRIOR, SIGNAL_WINDOW_S,
                                          SignalCollector, estimate_prompt_tokens)
from llmserve.autoscale.policy import ScalingPolicy
from llmserve.autoscale.book import InstanceBook
from llmserve.autoscale.capacity_classes import CLASSES, SPOT, replacement_class
from llmserve.autoscale.effects import (Advance, Draining, Effect, Start, Stop, Undrain, drain_effects, plan_effects,
                                        reclaim_effects)
from llmserve.autoscale.executor import Executor
from llmserve.autoscale.scaling_step import Override, scaling_step
from llmserve.flags import Flag
from llmserve.gateway.admission import AdmissionConfig, ConcurrencyConfig
from llmserve.gateway.balancer import BalancerConfig
from llmserve.lifecycle import InstanceState
from llmserve.priority import PriorityClass
from llmserve.sim.adapters import SimAdapters
from llmserve.sim.gateway import SimGateway
from llmserve.sim.instance import SimInstance, Seq
from llmserve.sim.profile import InstanceProfile
from llmserve.sim.provider import SimLauncher, SimRouter
from llmserve.sim.results import PENDING, COMPLETED, EXPIRED, RECLAIMED, REJECTED, SimRecord, SimResult, TimelineRow
from llmserve.sim.sharing import BusyInstances
from llmserve.sim.spot import SimCapacity
from llmserve.sim.traces import Trace

if TYPE_CHECKING:
    from llmserve.autoscale.managed import ControllerConfig

S = InstanceState
# Read per request or step: an enum class's member is a slow attribute to read.
_DRAINING, _REALTIME, _BATCH = S.DRAINING, PriorityClass.REALTIME, PriorityClass.BATCH
_STEP, _LIFECYCLE, _TICK, _POLL, _RECLAIM, _TAKEN, _ADAPTER = 0, 1, 2, 3, 4, 5, 6


class SimConfig(BaseModel):
    """Simulator settings that are not the policy's, the trace's or the instance's.

    The signal settings mean what they mean in the live ``ControllerConfig`` and
    default to the same values. ``prompt_chars_per_token`` is how many characters
    the trace's prompts would have per token: the simulator feeds the policy the
    estimate the live gateway makes from those characters, not the exact count.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    initial_instances: Annotated[int, Flag(skip=True)] = 1  # set per run (--initial-instances: a default)
    poll_interval_s: float = Field(5.0, description="seconds between the gateway's load polls")
    signal_window_s: float = Field(SIGNAL_WINDOW_S, description="seconds of arrivals the scaling signals average")
    latency_window_s: float = Field(LATENCY_WINDOW_S, description="seconds of latencies the scaling signals hold")
    output_tokens_prior: float = Field(OUTPUT_TOKENS_PRIOR,
                                       description="output tokens expected of a request before any ends")
    chars_per_token: float = Field(CHARS_PER_TOKEN, description="prompt characters the controller counts as a token")
    prompt_chars_per_token: float = Field(CHARS_PER_TOKEN, description="characters the trace's prompts have per "
                                          "token (the live gateway's estimate is made from them)")
    seed: int = 0
    reclaim_rate_per_h: float = Field(0.0, description="reclaim notices per spot instance-hour, seeded "
                                                       "(0.05: one spot instance in 20 per hour)")
    reclaim_notice_s: Annotated[float, Flag(name="--reclaim-notice-s")] = Field(
        120.0, description="notice before a reclaimed instance is taken (AWS: 120 s; GCP gives 30)")

    @model_validator(mode="after")
    def _checked(self) -> SimConfig:
        if self.initial_instances < 0:
            raise ValueError("sim: initial_instances must be >= 0")
        if self.poll_interval_s <= 0 or self.signal_window_s <= 0 or self.latency_window_s <= 0:
            raise ValueError("sim: intervals and windows must be positive")
        if self.reclaim_rate_per_h < 0 or self.reclaim_notice_s < 0:
            raise ValueError("sim: reclaim_rate_per_h and reclaim_notice_s must be >= 0")
        if self.chars_per_token <= 0 or self.prompt_chars_per_token <= 0:
            raise ValueError("sim: characters per token must be positive")
        return self

    @classmethod
    def like(cls, ctrl: ControllerConfig, **kw: object) -> "SimConfig":
        """The signal settings of a live controller's config; ``kw`` sets the rest."""
        return cls(signal_window_s=ctrl.signal_window_s, latency_window_s=ctrl.latency_window_s,
                   output_tokens_prior=ctrl.output_tokens_prior, chars_per_token=ctrl.chars_per_token,
                   **kw)  # type: ignore[arg-type]


class Simulator:
    """Runs ``trace`` through a pool of ``profile`` instances scaled by ``autoscale``."""

    def __init__(self, trace: Trace, profile: InstanceProfile, autoscale: AutoscaleConfig,
                 sim: SimConfig | None = None, admission: AdmissionConfig | None = None,
                 concurrency: ConcurrencyConfig | None = None, balancer: BalancerConfig | None = None,
                 label: str | None = None, policy: ScalingPolicy | None = None,
                 adapters: SimAdapters | None = None, adapter_of: list[str | None] | None = None) -> None:
        self.trace = trace
        self.profile = profile
        self.autoscale = autoscale
        self.cfg = sim or SimConfig()
        self.label = label or autoscale.policy
        self.policy = policy or build_policy(autoscale)  # a given one: e.g. the oracle's schedule
        self.gateway = SimGateway(self._deliver, admission, concurrency, balancer, seed=self.cfg.seed)
        self.collector = SignalCollector(self.cfg.signal_window_s, self.cfg.latency_window_s,
                                         self.cfg.output_tokens_prior, start=0.0)
        self.now = 0.0  # the time of the event being handled
        self.cores = BusyInstances(profile.sharing) if profile.sharing else None
        self.book: InstanceBook[SimInstance] = InstanceBook(lambda: self.now, lambda: self.now, keep_finished=None)
        self.book.listeners.append(lambda inst, old, new, now: inst.moved(old, new, now))
        self.launcher = SimLauncher(profile, self.cores, self._reach, self._born)
        self.executor = Executor(self.book, self.launcher, SimRouter(self.gateway, lambda: self.now),
                                 itertools.count().__next__, name=self.label)
        self.launcher.exited = self.executor.exited
        self.adapters = adapters
        # Each request's adapter (None: the base): given, else drawn with the adapters' shares.
        self.adapter_of = adapter_of or (adapters.assign(len(trace), self.cfg.seed) if adapters else [None] * len(trace))
        self.launcher.max_adapters = adapters.max_resident if adapters else None
        self._heap: list[tuple] = []
        self._seq = 0
        # The columns read per request, as arrays of machine numbers: an item is a plain int or
        # float (a numpy scalar costs several times as much to read and to compute with).
        self._arrival = _column(trace.arrival_s, "d")
        self._prompt, self._output = _column(trace.prompt_tokens, "q"), _column(trace.output_tokens, "q")
        self._priority = _column(trace.priority, "q")
        n = len(trace)
        # Written per request as arrays (an item set costs a third of a numpy one), read as
        # numpy views of the same memory.
        self._status = array("b", bytes(n))
        self._ttft, self._e2e = array("d", [math.nan]) * n, array("d", [math.nan]) * n
        self.status = np.frombuffer(self._status, np.int8)
        self.ttft, self.e2e = np.frombuffer(self._ttft, np.float64), np.frombuffer(self._e2e, np.float64)
        self.timeline: list[TimelineRow] = []
        self.events: list[tuple[float, int, int, str]] = []
        c = self.cfg
        self.capacity = SimCapacity(autoscale.capacity, autoscale.bounds.min_instances, c.reclaim_rate_per_h,
                                    c.reclaim_notice_s, c.seed)
        self.capacity.horizon_s = trace.duration_s
        self.override: Override | None = None  # a manual count, as an operator sets it live
        self.batch_out = 0  # batch-class requests on instances: the live pool's batch in flight
        self.progress: Callable[[float, int], None] | None = None  # (simulated time, arrivals) each tick
        # Read per request: plain numbers (a pydantic field costs ~10x a plain attribute to read).
        self._trace_chars, self._chars_per_token = c.prompt_chars_per_token, c.chars_per_token
        self._overhead_s = profile.request_overhead_s
        self._kv_cap = profile.kv_capacity_tokens

    # ---- event plumbing -------------------------------------------------------------------
    def _push(self, t: float, kind: int, a: object = None, b: object = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, a, b))

    def _schedule(self, inst: SimInstance) -> None:
        self._push(inst.seg_end, _STEP, inst, inst.version)

    # ---- lifecycle: the live executor's effects -------------------------------------------
    @property
    def instances(self) -> dict[int, SimInstance]:
        return self.book.instances  # not yet stopped

    def _reach(self, t: float, state: InstanceState, inst: SimInstance) -> None:
        self._push(t, _LIFECYCLE, inst, state)

    def _born(self, inst: SimInstance) -> None:
        notice_at = self.capacity.added(inst, inst.capacity_class)
        if notice_at is not None:
            self._push(notice_at, _RECLAIM, inst)

    def _act(self, effects: list[Effect], now: float) -> None:
        """Apply ``effects``; a drained instance with nothing left on it stops at once."""
        self.executor.apply(effects, now)
        drained = [Draining(i.id, 0, 0, now - (i.drain_started or now))
                   for i in self.book.in_state(S.DRAINING) if i.in_flight == 0]
        if drained:
            self.executor.apply(drain_effects(drained, math.inf), now)
        if any(isinstance(e, Undrain) or (isinstance(e, Advance) and e.to is S.READY) for e in effects):
            self._dispatch(now)

    def _lifecycle(self, inst: SimInstance, target: InstanceState, now: float) -> None:
        if inst.state is (S.STARTING if target is S.WARMING else S.WARMING):  # not cancelled since its start
            self._act([Advance(inst.id, target, "cold start")], now)

    def _notice(self, inst: SimInstance, now: float) -> None:
        """A reclaim notice, handled as the live controller does; at the deadline it is taken."""
        if inst.id not in self.instances:
            return  # it stopped before its notice came
        self.capacity.reclaims += 1
        inst.reclaim_at = now + self.capacity.notice_s
        self._act(reclaim_effects(inst.id, inst.state, self.capacity.notice_s,
                                  replacement_class(SPOT, self.capacity.cfg, True)), now)
        if inst.id in self.instances:
            self._push(inst.reclaim_at, _TAKEN, inst)

    def _taken(self, inst: SimInstance, now: float) -> None:
        """The provider takes it: what still runs on it is cut (a miss for both SLOs)."""
        if inst.id not in self.instances:
            return
        for seq in inst.cut():
            self.batch_out -= int(self._priority[seq.rid] > 0)
            self._finish(seq.rid, RECLAIMED, now)
        self._act([Stop(inst.id, "taken by the provider")], now)

    # ---- controller tick ----------------------------------------------------------------------------
    def _tick(self, now: float, state: object) -> object:
        counts = {s: 0 for s in S}
        for i in self.instances.values():
            counts[i.state] += 1
        # In flight to every instance not yet stopped, draining ones too: the live pool's count.
        ctx = self.collector.snapshot(now, self.gateway.reports(), self.gateway.queue_depth(), counts,
                                      sum(i.in_flight for i in self.instances.values()), self.batch_out)
        if self.override is not None and not self.override.in_force(now):
            self.override = None
        statuses = self.book.statuses(lambda i: i.in_flight)
        step = scaling_step(self.policy, state, ctx, statuses, self.override, planner=self.capacity.plan)
        if step.changes:
            self.events.append((now, step.provisioned, step.desired, step.reason))
            self._act(plan_effects(step.plan, step.reason), now)
        self.timeline.append(TimelineRow(now, ctx.arrival_rate, ctx.arrival_tokens_per_s, ctx.ready, ctx.coming,
                                         ctx.draining, step.desired, ctx.queued,
                                         ctx.ttft_p99 if ctx.ttft_p99 is not None else np.nan))
        return step.state

    # ---- requests ---------------------------------------------------------------------------------
    def _dispatch(self, now: float) -> None:
        self.gateway.dispatch(now)

    def _deliver(self, rid: int, inst: SimInstance, now: float) -> None:
        self.batch_out += int(self._priority[rid] > 0)
        seq = Seq(rid, self._prompt[rid], self._output[rid])
        adapter = self.adapter_of[rid]
        if adapter is not None:
            at = inst.adapters.serve_at(adapter, now, self.adapters.load_s)
            if at > now:  # its adapter is loading there: the request waits for the load
                inst.held.append(seq)
                self._push(at, _ADAPTER, inst, seq)
                return
        if inst.add(seq, now):
            self._schedule(inst)

    def _loaded(self, inst: SimInstance, seq: Seq, now: float) -> None:
        if seq in inst.held:  # not cut since (a reclaim)
            inst.held.remove(seq)
            if inst.add(seq, now):
                self._schedule(inst)

    def _finish(self, rid: int, status: int, now: float) -> None:
        if self._status[rid] != PENDING:
            raise RuntimeError(f"request {rid} ended twice")
        self._status[rid] = status
        if status == COMPLETED:
            self._e2e[rid] = now - self._arrival[rid]

    def _step(self, inst: SimInstance, now: float) -> None:
        inst.end_segment(now)
        arrival, batch = self._arrival, self._priority
        seen = now + self._overhead_s  # when the client gets it: latency outside the engine
        for s in inst.first_tokens:
            ttft = seen - arrival[s.rid]
            self._ttft[s.rid] = ttft
            self.collector.record_first_token(now, ttft, bool(batch[s.rid]))
        for s in inst.finished:
            self._finish(s.rid, COMPLETED, seen)
            self.batch_out -= int(batch[s.rid] > 0)
            self.collector.record_finish(now, seen - arrival[s.rid], s.output, bool(batch[s.rid]))
        freed = bool(inst.finished)
        inst.first_tokens.clear()
        inst.finished.clear()
        if inst.plan(now):
            self._schedule(inst)
        if inst.state is _DRAINING and inst.in_flight == 0:
            self.executor.apply(drain_effects([Draining(inst.id, 0, 0, now - (inst.drain_started or now))],
                                              math.inf), now)
        if freed:
            self.gateway.changed(inst)
            self._dispatch(now)

    def _arrive(self, rid: int, now: float) -> None:
        chars = self._prompt[rid] * self._trace_chars
        batch = self._priority[rid] != 0
        self.collector.record_arrival(now, estimate_prompt_tokens(chars, self._chars_per_token), batch)
        if self._prompt[rid] + self._output[rid] > self._kv_cap:
            # Never admissible (it would block its instance's queue forever): the live engine's
            # context is capped at its KV capacity and it refuses such a request at once (400).
            self._finish(rid, REJECTED, now)
            return
        if not self.gateway.offer(rid, _BATCH if batch else _REALTIME, now, self.adapter_of[rid]):
            self._finish(rid, REJECTED, now)
            return
        self.gateway.dispatch(now)

    # ---- main loop ------------------------------------------------------------------------------------
    def run(self) -> SimResult:
        wall, cpu = time.perf_counter(), time.process_time()
        cfg, trace = self.cfg, self.trace
        self.launcher.ready_at_once = True  # the pool the day starts with is warm
        first = self.capacity.start_classes(self.capacity.plan(cfg.initial_instances, []))
        for inst in self.executor.apply([Start("initial", c) for c in first], 0.0):
            self.executor.apply([Advance(inst.id, S.READY, "initial")], 0.0)
        self.launcher.ready_at_once = False
        tick_s = self.autoscale.tick_s
        self._push(tick_s, _TICK)
        self._push(cfg.poll_interval_s, _POLL)
        state = self.policy.initial_state()
        arrivals = self._arrival
        n, k = len(arrivals), 0
        heap = self._heap
        pending = n
        while heap:
            t_next = arrivals[k] if k < n else math.inf
            if heap[0][0] > t_next:
                self.now = t_next
                self._arrive(k, t_next)
                k += 1
                continue
            now, _, kind, a, b = heapq.heappop(heap)
            self.now = now
            if kind == _STEP:
                if b == a.version:
                    self._step(a, now)
            elif kind == _LIFECYCLE:
                self._lifecycle(a, b, now)
            elif kind == _RECLAIM:
                self._notice(a, now)
            elif kind == _TAKEN:
                self._taken(a, now)
            elif kind == _ADAPTER:
                self._loaded(a, b, now)
            elif kind == _POLL:
                self.gateway.poll(now)
                for rid in self.gateway.expire(now):
                    self._finish(rid, EXPIRED, now)
                pending = k < n or bool(np.any(self.status[:k] == PENDING)) if now >= trace.duration_s else True
                if pending:
                    self._push(now + cfg.poll_interval_s, _POLL)
            elif kind == _TICK:
                state = self._tick(now, state)
                if self.progress is not None:
                    self.progress(now, k)
                if now < trace.duration_s or pending:
                    self._push(now + tick_s, _TICK)
        if k < n or np.any(self.status == PENDING):
            raise RuntimeError("simulation ended with requests unresolved")
        return SimResult.build(self.record(), time.perf_counter() - wall, time.process_time() - cpu)

    def record(self) -> SimRecord:
        """What the run produced, as plain data (:class:`SimResult` reads it by name)."""
        insts = [*self.book.finished, *self.instances.values()]
        cap = self.capacity
        return SimRecord(self.label, self.trace, self.autoscale.slo, self.status.copy(), self.ttft.copy(),
                         self.e2e.copy(), list(self.timeline), list(self.events),
                         {i.id: (i.created, i.stopped_at) for i in insts}, {i.id: i.capacity_class for i in insts},
                         {c: cap.cfg.price(c) for c in CLASSES}, cap.reclaims)


def _column(values: np.ndarray, code: str) -> array:
    out = array(code)
    out.frombytes(np.ascontiguousarray(values, dtype=np.float64 if code == "d" else np.int64).tobytes())
    return out
