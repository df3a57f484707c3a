"""A day with a batch backlog: the live batch runner's pacing, in the simulator.

A backlog of ``lines`` requests is submitted at ``submit_s`` with a completion
window. As live (``gateway/batches/runner.py``), the lines wait outside the
admission queues and are released ``lines_in_flight`` at a time, from the same
pure rules (``gateway/batches/pace.py``; the share of seats that follows the
policy's forecast, ``gateway/batches/share.py``) and the same pace meter; a line the
gateway refuses (a full queue, a deadline) goes back to wait, as the runner
retries a 429 / 503. Everything else is the simulator's: the same admission,
dispatch, balancer, signals and scaling step, so the report says what the
backlog costs the realtime traffic and the pool: realtime SLO attainment, when
the batch finished, instance-hours.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from llmserve.lifecycle import InstanceState as S
from llmserve.autoscale.outlook import realtime_load
from llmserve.gateway.batches.config import BatchShareConfig
from llmserve.gateway.batches.pace import PaceMeter, lines_in_flight, told_need
from llmserve.gateway.batches.share import base_lines, batch_room
from llmserve.sim.results import COMPLETED, EXPIRED, REJECTED, SimResult
from llmserve.sim.simulator import Simulator
from llmserve.sim.traces import Trace


@dataclass(frozen=True, slots=True)
class Backlog:
    lines: int
    submit_s: float
    window_s: float = 24 * 3600.0
    prompt_tokens: int = 300
    output_tokens: int = 200
    base: int = 2  # batches.concurrency: per ready instance
    ceiling: int = 64  # batches.max_concurrency
    share: BatchShareConfig | None = BatchShareConfig()  # batches.share


def with_backlog(trace: Trace, backlog: Backlog) -> tuple[Trace, np.ndarray]:
    """The trace with the backlog's lines added at ``submit_s`` (batch class), and which rows they are."""
    n = backlog.lines
    arrival = np.concatenate([trace.arrival_s, np.full(n, backlog.submit_s)])
    order = np.argsort(arrival, kind="stable")
    mask = np.concatenate([np.zeros(len(trace), bool), np.ones(n, bool)])[order]
    joined = Trace(f"{trace.name}+backlog", arrival[order],
                   np.concatenate([trace.prompt_tokens, np.full(n, backlog.prompt_tokens)])[order],
                   np.concatenate([trace.output_tokens, np.full(n, backlog.output_tokens)])[order],
                   np.concatenate([trace.priority, np.ones(n, trace.priority.dtype)])[order],
                   max(trace.duration_s, backlog.submit_s), trace.rate_t, trace.rate_rps)
    return joined, mask


class BacklogSimulator(Simulator):
    """A simulator whose backlog rows are released by the batch runner's rule."""

    def __init__(self, trace: Trace, backlog: Backlog, *args, **kw) -> None:
        joined, self.is_line = with_backlog(trace, backlog)
        super().__init__(joined, *args, **kw)
        self.backlog = backlog
        self.held: deque[int] = deque()
        self.in_flight = 0
        self.finished = 0
        self.done_at = float("nan")
        self.meter = PaceMeter()
        self.ready_now = 0
        self.room = batch_room(())
        self.load: float | None = None  # the policy's forecast realtime load, in instances

    def _arrive(self, rid: int, now: float) -> None:
        if self.is_line[rid]:
            self.held.append(rid)
            self._release(now)
        else:
            super()._arrive(rid, now)

    def _finish(self, rid: int, status: int, now: float) -> None:
        if self.is_line[rid]:
            self.in_flight -= 1
            if status in (REJECTED, EXPIRED):  # the runner tries it again later
                self.held.append(rid)
                return
            self.finished += 1
            if self.finished == self.backlog.lines:
                self.done_at = now
        super()._finish(rid, status, now)

    def _step(self, inst, now: float) -> None:
        super()._step(inst, now)
        self._release(now)

    def _tick(self, now: float, state: object) -> object:
        b = self.backlog
        # what the live runner tells the controller: the rate the window requires, while idle seats fall short
        left = b.submit_s + b.window_s - now
        ready = [i for i in self.instances.values() if i.state is S.READY]
        self.ready_now = len(ready)  # as the runner counts, and their batch room as it reads it
        self.room = batch_room((i.profile.max_num_seqs, self.gateway.picker.concurrency) for i in ready)
        need = told_need(b.lines - self.finished, left, self.meter.rate(now, self.finished))
        self.collector.set_batch_need(need if now >= b.submit_s else 0.0)
        out = super()._tick(now, state)
        self.load = realtime_load(self.policy, out, now)  # as the live controller publishes it
        self._release(now)
        return out

    def _release(self, now: float) -> None:
        b = self.backlog
        left = b.submit_s + b.window_s - now
        base = base_lines(b.share, b.base, b.ceiling, self.load, self.ready_now, self.room)
        allowed = lines_in_flight(base, b.ceiling, b.lines - self.finished, self.meter.rate(now, self.finished), left)
        # at most one try per held line per call: a refused one waits for the next step or tick
        for _ in range(min(len(self.held), max(allowed - self.in_flight, 0))):
            self.in_flight += 1
            super()._arrive(self.held.popleft(), now)


@dataclass(frozen=True, slots=True)
class DayReport:
    realtime_ttft_attainment: float
    realtime_ttft_p99_s: float
    instance_hours: float
    batch_done_s: float | None  # after submission; None: no backlog, or not finished
    batch_lines: int


def compare_day(trace: Trace, backlog: Backlog, *args, **kw) -> tuple[DayReport, DayReport]:
    """The day without the backlog and with it (the same pool, policy and settings: ``args``, ``kw``
    as :class:`Simulator` takes them); the realtime TTFT SLO is the autoscale config's."""
    slo = args[1].slo.ttft_s if len(args) > 1 else kw["autoscale"].slo.ttft_s
    without = report(Simulator(trace, *args, **kw).run(), None, slo)
    sim = BacklogSimulator(trace, backlog, *args, **kw)
    return without, report(sim.run(), sim.is_line, slo, backlog.submit_s, sim.done_at)


def report(res: SimResult, is_line: np.ndarray | None, ttft_slo_s: float, submit_s: float = 0.0,
           done_at: float = float("nan")) -> DayReport:
    rt = ~is_line if is_line is not None else np.ones(len(res.status), bool)
    ok = (res.status[rt] == COMPLETED) & (np.nan_to_num(res.ttft[rt], nan=np.inf) <= ttft_slo_s)
    ttft = res.ttft[rt]
    return DayReport(float(ok.mean()) if ok.size else 1.0,
                     float(np.nanpercentile(ttft, 99)) if np.any(~np.isnan(ttft)) else float("nan"),
                     res.summary.instance_hours, None if np.isnan(done_at) else done_at - submit_s,
                     int(is_line.sum()) if is_line is not None else 0)
