"""Admission: the gateway's realtime and batch queues for one pool, pure.

A request is sent upstream only when an instance has room (``has_room``), else it
waits here. Realtime goes first, but while both classes wait, batch is owed
``batch_min_share`` of dispatches (a deficit counter: each contested dispatch
earns batch that much credit, one credit buys a batch dispatch), so batch never
starves yet cannot take more than its share from waiting realtime work. Each
class has a cap (beyond it: 429 with ``Retry-After``) and a queue deadline
(past it the item is expired with a reason; the app answers 503).

Callers pass ``now`` from a monotonic clock; FIFO order within a class relies on it.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from llmserve.gateway.instance import NOT_REPORTED, InstanceView
from llmserve.load_report import LoadReport
from llmserve.priority import PriorityClass

T = TypeVar("T")


class ClassLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_queue: int = Field(ge=1)  # waiting requests; beyond it 429
    deadline_s: float = Field(gt=0.0)  # longest wait in the gateway's queue; beyond it 503


class AdmissionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    realtime: ClassLimits = ClassLimits(max_queue=512, deadline_s=30.0)
    batch: ClassLimits = ClassLimits(max_queue=4096, deadline_s=600.0)
    batch_min_share: float = Field(0.2, ge=0.0, le=1.0)

    def limits(self, priority: PriorityClass) -> ClassLimits:
        return self.realtime if priority is PriorityClass.REALTIME else self.batch


@dataclass(slots=True)  # not frozen: one per request, and frozen fields are set dearly
class Admitted:
    ticket: int
    priority: PriorityClass


@dataclass(frozen=True, slots=True)
class Rejected:
    retry_after_s: int
    reason: str
    status: int = 429


@dataclass(slots=True)  # not frozen: one per request, and frozen fields are set dearly
class Ticket(Generic[T]):
    """A queued item."""

    ticket: int
    item: T
    priority: PriorityClass
    enqueued_at: float
    deadline: float


@dataclass(frozen=True, slots=True)
class Expired(Generic[T]):
    entry: Ticket[T]
    waited_s: float
    reason: str


@dataclass(frozen=True, slots=True)
class ClassStats:
    depth: int
    oldest_wait_s: float
    admitted: int
    rejected: int
    dispatched: int
    expired: int
    removed: int
    wait_s_sum: float  # over dispatched items; with ``dispatched``, the mean wait


_RATE_WINDOW_S = 10.0


class _ClassQueue(Generic[T]):
    def __init__(self) -> None:
        self.items: OrderedDict[int, Ticket[T]] = OrderedDict()
        self.recent_dispatches: deque[float] = deque(maxlen=4096)
        self.admitted = self.rejected = self.dispatched = self.expired = self.removed = 0
        self.wait_s_sum = 0.0


class AdmissionQueue(Generic[T]):
    """Realtime and batch queues of one pool.

    Every item offered and admitted ends exactly one way: returned by
    ``next_to_dispatch``, returned by ``expire``, removed by ``remove``, or still
    queued. Items past their deadline are never dispatched; ``next_to_dispatch``
    sets them aside for the next ``expire`` call.
    """

    def __init__(self, config: AdmissionConfig | None = None) -> None:
        self.config = config or AdmissionConfig()
        self._queues = {p: _ClassQueue[T]() for p in PriorityClass}
        self._ids = itertools.count(1)
        self._batch_credit = 0.0
        self._expired: list[Expired[T]] = []
        # Read per request: the two class queues, and their limits as plain numbers (an enum
        # class's member and a pydantic field each cost ~10x a plain attribute to read).
        self._rt, self._batch = self._queues[PriorityClass.REALTIME], self._queues[PriorityClass.BATCH]
        self._limits = {p: (self.config.limits(p).max_queue, self.config.limits(p).deadline_s) for p in PriorityClass}

    def __len__(self) -> int:
        return len(self._rt.items) + len(self._batch.items)  # read on every dispatch round

    def depth(self, priority: PriorityClass) -> int:
        return len(self._queues[priority].items)

    def offer(self, item: T, priority: PriorityClass, now: float) -> Admitted | Rejected:
        q, (max_queue, deadline_s) = self._queues[priority], self._limits[priority]
        if len(q.items) >= max_queue:
            q.rejected += 1
            return Rejected(self._retry_after(priority, now),
                            f"the {priority.name.lower()} queue is full "
                            f"({max_queue} waiting)")
        ticket = next(self._ids)
        q.items[ticket] = Ticket(ticket, item, priority, now, now + deadline_s)
        q.admitted += 1
        return Admitted(ticket, priority)

    def remove(self, ticket: int) -> bool:
        """Withdraw a waiting item (its client went away). False if not waiting."""
        for q in self._queues.values():
            if q.items.pop(ticket, None) is not None:
                q.removed += 1
                return True
        return False

    def next_to_dispatch(self, now: float, has_capacity: bool, batch_capacity: bool | None = None) -> Ticket[T] | None:
        """The item to send upstream now, or None (nothing waiting or no capacity);
        ``batch_capacity`` False: only realtime may go (the room left is realtime's)."""
        self._set_aside_expired(now)
        if not has_capacity:
            return None
        rt, batch = self._rt, self._batch
        if batch_capacity is False:
            if not rt.items:
                return None
            chosen = rt
        elif rt.items and batch.items:
            self._batch_credit += self.config.batch_min_share
            if self._batch_credit >= 1.0 - 1e-9:
                self._batch_credit -= 1.0
                chosen = batch
            else:
                chosen = rt
        elif rt.items:
            chosen = rt
        elif batch.items:
            chosen = batch
        else:
            return None
        _, entry = chosen.items.popitem(last=False)
        chosen.dispatched += 1
        chosen.wait_s_sum += now - entry.enqueued_at
        chosen.recent_dispatches.append(now)
        return entry

    def expire(self, now: float) -> list[Expired[T]]:
        """Remove and return every item past its deadline (the app answers 503)."""
        self._set_aside_expired(now)
        out, self._expired = self._expired, []
        return out

    def next_deadline(self) -> float | None:
        """The earliest deadline of anything waiting, for the caller's wake-up timer."""
        heads = [next(iter(q.items.values())).deadline for q in self._queues.values() if q.items]
        return min(heads) if heads else None

    def stats(self, now: float) -> dict[PriorityClass, ClassStats]:
        out = {}
        for p, q in self._queues.items():
            oldest = next(iter(q.items.values())).enqueued_at if q.items else now
            out[p] = ClassStats(len(q.items), now - oldest, q.admitted, q.rejected,
                                q.dispatched, q.expired, q.removed, q.wait_s_sum)
        return out

    def _set_aside_expired(self, now: float) -> None:
        for p, q in self._queues.items():
            while q.items:
                entry = next(iter(q.items.values()))
                if entry.deadline > now:
                    break
                q.items.popitem(last=False)
                q.expired += 1
                waited = now - entry.enqueued_at
                self._expired.append(Expired(entry, waited, (
                    f"request waited {waited:.1f} s in the {p.name.lower()} queue, past its "
                    f"deadline of {self.config.limits(p).deadline_s:g} s; no instance had room")))

    def _retry_after(self, priority: PriorityClass, now: float) -> int:
        """Seconds until the queue has likely drained enough: depth / recent rate."""
        q, deadline = self._queues[priority], self.config.limits(priority).deadline_s
        while q.recent_dispatches and q.recent_dispatches[0] < now - _RATE_WINDOW_S:
            q.recent_dispatches.popleft()
        rate = len(q.recent_dispatches) / _RATE_WINDOW_S
        if rate <= 0:
            return max(1, math.ceil(deadline))
        return max(1, min(math.ceil(deadline), math.ceil(len(q.items) / rate)))


# ---- per-instance room --------------------------------------------------------------

class ConcurrencyConfig(BaseModel):
    """How many requests an instance may hold (running plus waiting in it).

    Default: its reported ``max_num_seqs`` times ``oversubscription`` (a little
    above 1 keeps the engine's batch full between completions; the engine queues
    the excess). ``fixed`` overrides; ``default`` applies to an instance whose reports
    carry no seats; one not reported yet takes one request until it is.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    fixed: int | None = Field(None, ge=1)
    oversubscription: float = Field(1.0, gt=0.0)
    default: int = Field(8, ge=1)
    # The share of an instance's room batch-class requests leave free (rounded down):
    # a realtime request then finds a seat at once beside a batch backlog, instead
    # of waiting for a long batch line to finish (issue 33).
    realtime_reserve: float = Field(0.25, ge=0.0, lt=1.0)


def concurrency_target(report: LoadReport | None, config: ConcurrencyConfig) -> int:
    return seats_target(report.max_num_seqs if report is not None else NOT_REPORTED, config)


def seats_target(seats: int, config: ConcurrencyConfig) -> int:
    """The concurrency target of an instance reporting ``seats`` batch seats (0: a report that
    says none, a foreign server's: ``default``). Not reported yet (just added, the first report
    a poll away): one request, so a new instance does not take a whole queue before it says
    how many it can hold (it took 6 with 2 seats)."""
    if config.fixed is not None:
        return config.fixed
    if seats == NOT_REPORTED:
        return 1
    if seats > 0:
        return max(1, math.ceil(seats * config.oversubscription))
    return config.default


def batch_limit(target: int, config: ConcurrencyConfig) -> int:
    """The load below which a batch-class request may go: the realtime reserve stays free."""
    return target - math.floor(target * config.realtime_reserve)


def has_room(instance: InstanceView, config: ConcurrencyConfig) -> bool:
    return instance.est_load < concurrency_target(instance.report, config)


def has_batch_room(instance: InstanceView, config: ConcurrencyConfig) -> bool:
    """Room for a batch-class request: the realtime reserve stays free."""
    return instance.est_load < batch_limit(concurrency_target(instance.report, config), config)


class RoomLimits(dict[int, int]):
    """Seats -> the load below which an instance has room (``batch``: batch room), kept as
    found: the picker reads one per candidate per round, so it is a dict look-up, not a call.
    ``has_room(i, c)`` is ``i.est_load < RoomLimits(c)[i.seats]``."""

    def __init__(self, config: ConcurrencyConfig, batch: bool = False) -> None:
        super().__init__()
        self.config = config
        self.batch = batch

    def __missing__(self, seats: int) -> int:
        target = seats_target(seats, self.config)
        limit = self[seats] = batch_limit(target, self.config) if self.batch else target
        return limit
