"""The one executor of effects (:mod:`llmserve.autoscale.effects`), live and simulated.

It moves instances in the :class:`~llmserve.autoscale.book.InstanceBook`, asks a
:class:`Launcher` to start and stop what backs them (a provider's processes, or
simulated engines), and tells a :class:`Router` only what routing needs: an
instance joins (ready), stops or resumes accepting requests, leaves. The launcher
reports back (:meth:`Executor.started`, :meth:`Executor.start_failed`,
:meth:`Executor.exited`) when its work ends, at once or later.

It also keeps the restart back-off: failures of instances that never got ready
hold further starts for a doubling time, and each failed instance that was
capacity is owed a replacement. After ``max_start_failures`` such failures in a
row the pool gives up (:mod:`llmserve.autoscale.start_failures`) until :meth:`Executor.retry`.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Protocol

from llmserve.autoscale.book import InstanceBook
from llmserve.autoscale.effects import Advance, Drain, Effect, Fail, Start, Stop, Undrain
from llmserve.autoscale.probe import path
from llmserve.autoscale.start_failures import GaveUp, gives_up
from llmserve.lifecycle import InstanceState

log = logging.getLogger("llmserve.autoscale.controller")
S = InstanceState


class Launcher(Protocol):
    """What backs an instance: starts it, stops it, frees it after a failure."""

    def create(self, iid: Hashable, now: float, start: Start) -> Any: ...
    def launch(self, rec: Any) -> None: ...
    def stopping(self, rec: Any) -> bool: ...  # a stop is already under way
    def halt(self, rec: Any, reason: str) -> None: ...  # then Executor.exited, now or later
    def release(self, rec: Any, reason: str) -> None: ...


class Router(Protocol):
    """What the gateway is told: membership and whether an instance takes new requests."""

    def join(self, rec: Any) -> str | None: ...  # why it could not, or None
    def leave(self, rec: Any, reason: str) -> None: ...
    def accepting(self, rec: Any, accepting: bool) -> None: ...
    def in_flight(self, rec: Any) -> int: ...
    def served(self, rec: Any) -> int: ...
    def failed(self, why: str | None) -> None: ...  # the pool gave up starting (None: it tries again)


class Executor:
    def __init__(self, book: InstanceBook, launcher: Launcher, router: Router, ids: Callable[[], Hashable],
                 restart_backoff_s: float = 0.0, max_restart_backoff_s: float = 0.0, metrics: Any = None,
                 labels: tuple[str, ...] = (), name: str = "", max_start_failures: int = 0) -> None:
        self.book = book
        self.launcher = launcher
        self.router = router
        self.ids = ids
        self.restart_backoff_s = restart_backoff_s
        self.max_restart_backoff_s = max_restart_backoff_s
        self.metrics = metrics
        self.labels = labels
        self.name = name
        self.max_start_failures = max_start_failures  # 0: never give up
        self.gave_up: GaveUp | None = None
        self.log: list[tuple[float, Effect]] | None = None  # set to a list to record every effect applied
        self.replacements: deque[Hashable] = deque()  # failed instances owed a replacement
        self.failures_before_ready = 0
        self.start_not_before = 0.0

    def apply(self, effects: Iterable[Effect], now: float) -> list[Any]:
        """Carry out ``effects`` in order; the records of the instances started."""
        started = []
        for e in effects:
            if self.log is not None:
                self.log.append((now, e))
            if isinstance(e, Start):
                started.append(self._start(e, now))
                continue
            rec = self.book.get(e.id)
            if rec is None:
                continue  # gone since the effect was made (a stop already finished)
            if isinstance(e, Stop):
                self._stop(rec, e.reason, **e.details)
            elif isinstance(e, Drain):
                self.book.transition(rec, S.DRAINING, e.reason)
                rec.drain_started = now
                self.router.accepting(rec, False)
            elif isinstance(e, Undrain):
                self.book.transition(rec, S.READY, e.reason)
                rec.drain_started = None
                self.router.accepting(rec, True)
            elif isinstance(e, Advance):
                for state in path(rec.state, e.to):
                    self.book.transition(rec, state, e.reason)
                if rec.state is S.READY:
                    self._join(rec, now)
            elif isinstance(e, Fail):
                self._fail(rec, e.reason)
        return started

    # ---- what the launcher reports ------------------------------------------------------
    def started(self, rec: Any) -> None:
        """The launcher has what backs ``rec``; one cancelled meanwhile is stopped now."""
        if rec.state is S.STOPPING:
            self._stop(rec, rec.reason)

    def start_failed(self, rec: Any, reason: str) -> None:
        if rec.state is S.STARTING:
            self._fail(rec, reason)

    def exited(self, rec: Any, reason: str, code: int | None) -> None:
        rec.exit_code = code
        if rec.state is S.FAILED:
            self.book.event(rec.id, "cleaned_up", S.FAILED.value, S.FAILED.value, "process released", exit_code=code)
            return
        if rec.drain_started is not None and self.metrics is not None:  # it stopped after a drain
            self.metrics.drain.labels(*self.labels).observe(self.book.clock() - rec.drain_started)
        self.book.transition(rec, S.STOPPED, reason, exit_code=code)

    # ---- replacements ----------------------------------------------------------------------
    def due_replacements(self, now: float) -> list[Hashable]:
        """Failed instances whose replacement may start now (the back-off allowing)."""
        out = []
        while self.replacements and now >= self.start_not_before:
            out.append(self.replacements.popleft())
            if self.metrics is not None:
                self.metrics.replacements.labels(*self.labels).inc()
        return out

    # ---- the steps --------------------------------------------------------------------------
    def _start(self, e: Start, now: float) -> Any:
        rec = self.launcher.create(self.ids(), now, e)
        self.book.add(rec, e.reason, replaces=e.replaces, capacity_class=rec.capacity_class)
        self.launcher.launch(rec)
        return rec

    def _stop(self, rec: Any, reason: str, **details: Any) -> None:
        """Out of the pool and ``stopping``, then stopped by the launcher. Again for one
        already stopping whose start was still running: the stop it could not be sent."""
        stopping = rec.state is S.STOPPING
        if stopping and self.launcher.stopping(rec):
            return
        self.router.leave(rec, reason)
        if not stopping:
            self.book.transition(rec, S.STOPPING, reason, served=self.router.served(rec), **details)
        self.launcher.halt(rec, reason)

    def _fail(self, rec: Any, reason: str) -> None:
        provisioned = rec.state.provisioned
        never_ready = rec.ready_at is None
        self.router.leave(rec, reason)
        self.book.transition(rec, S.FAILED, reason)
        log.warning("%s: instance %s failed: %s", self.name, rec.id, reason)
        self.launcher.release(rec, reason)
        if never_ready:
            self.failures_before_ready += 1
            n = self.failures_before_ready
            backoff = min(self.max_restart_backoff_s, self.restart_backoff_s * 2 ** (n - 1))
            self.start_not_before = self.book.clock() + backoff
            serving = sum(1 for r in self.book if r.state in (S.READY, S.DRAINING))
            if self.gave_up is None and gives_up(n, self.max_start_failures, serving):
                self._give_up(n, reason)
        if provisioned:
            self.replacements.append(rec.id)

    def _join(self, rec: Any, now: float) -> None:
        why_not = self.router.join(rec)
        if why_not is not None:
            self._fail(rec, f"could not join the pool: {why_not}")
            return
        rec.ready_at = now
        self.failures_before_ready = 0
        self.start_not_before = 0.0
        if self.gave_up is not None:  # one started before the pool gave up made it after all
            self.retry(f"instance {rec.id} got ready")
        if self.metrics is not None:
            self.metrics.cold_start.labels(*self.labels).observe(now - rec.created)

    # ---- giving up -------------------------------------------------------------------------
    def _give_up(self, failures: int, reason: str) -> None:
        self.gave_up = g = GaveUp(failures, reason, self.book.wall())
        self.start_not_before = math.inf  # holds replacements and the plan's starts alike
        message = g.message(self.name)
        log.error("%s; POST /admin/autoscale/retry?pool=%s to try again", message, self.name)
        self.book.event(self.name, "pool_failed", None, "failed", message, failures=failures)
        self.router.failed(message)

    def retry(self, why: str) -> bool:
        """Start instances again after giving up (False: it had not)."""
        if self.gave_up is None:
            return False
        self.gave_up, self.failures_before_ready, self.start_not_before = None, 0, 0.0
        log.warning("%s: starting instances again (%s)", self.name, why)
        self.book.event(self.name, "pool_retry", "failed", "retrying", why)
        self.router.failed(None)
        return True
