"""Dispatch: queued requests to instances with room, in one order for every caller.

The live pool (:meth:`~llmserve.gateway.pool.Pool.pump`) and the simulator's
gateway (:class:`~llmserve.sim.gateway.SimGateway`) both run :class:`Dispatcher`,
so a simulated request waits, and lands, where a live one would. Each round:

1. the candidates: routable instances (ready, healthy, not draining, breaker
   closed or its half-open probe free) with room, from the caller's views;
2. none, and the pool is broken (every instance failing, see the caller's
   ``broken``): stop, so the caller fails what waits instead of letting it time out;
3. the admission queue's next request (realtime first, batch its share; it is
   only popped when a candidate exists, so nothing leaves the queue to wait
   elsewhere; a batch-class one only where an instance has room beyond the
   realtime reserve, ``has_batch_room``); one whose caller went away is skipped;
4. the picker chooses among the candidates, leaving out the request's
   ``exclude`` (instances a retry must avoid) unless only those have room;
5. the caller's ``commit`` hands the request over (reserves the slot, takes the
   breaker's probe), and the views are taken again: the load changed.

The picker filters once per round (``candidates``, then ``choose`` on those), so
the request path allocates no more than one pick did before.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Sequence
from typing import Generic, Protocol, TypeVar

from llmserve.gateway.admission import AdmissionQueue, Ticket, has_batch_room
from llmserve.priority import PriorityClass
from llmserve.gateway.balancer import Picker, RouteRequest
from llmserve.gateway.instance import InstanceView


class Queued(Protocol):
    """What the dispatcher reads of a queued item."""

    @property
    def request(self) -> RouteRequest: ...

    @property
    def exclude(self) -> Collection[str]: ...

    def withdrawn(self) -> bool:
        """True once nobody waits for it (the client went away): it is skipped."""
        ...


Q = TypeVar("Q", bound=Queued)
Views = Callable[[float], Sequence[InstanceView]]
Commit = Callable[[Ticket[Q], InstanceView, float], None]


class Stop(enum.Enum):
    """Why a dispatch run ended."""

    EMPTY = "nothing waiting"
    NO_ROOM = "no instance has room"
    BROKEN = "every instance is failing"


class Dispatcher(Generic[Q]):
    """Runs the dispatch rounds over one pool's queue and picker.

    ``views(now)`` gives the instances as the picker sees them; ``commit(ticket,
    instance, now)`` hands a request over; ``broken(views)``, if given, says the
    pool has failed (not merely full). They are bound once, here, so a run
    allocates nothing of its own.
    """

    def __init__(self, queue: AdmissionQueue[Q], picker: Picker, views: Views, commit: Commit,
                 broken: Callable[[Sequence[InstanceView]], bool] | None = None) -> None:
        self.queue = queue
        self.picker = picker
        self._views = views
        self._commit = commit
        self._broken = broken

    def run(self, now: float, views: Sequence[InstanceView] | None = None) -> Stop:
        """Dispatch until the queue is empty or nothing has room; ``views`` (taken at
        ``now``) saves the first round taking them again."""
        queue, picker = self.queue, self.picker
        while len(queue):
            if views is None:
                views = self._views(now)
            candidates, _ = picker.candidates(views)
            if not candidates and self._broken is not None and self._broken(views):
                return Stop.BROKEN
            concurrency = picker.concurrency
            roomy = [c for c in candidates if has_batch_room(c, concurrency)] if candidates else candidates
            entry = queue.next_to_dispatch(now, bool(candidates), bool(roomy))
            if entry is None:
                # with room for both classes, only expiries are left
                return Stop.NO_ROOM if not candidates or len(queue) else Stop.EMPTY
            item = entry.item
            if item.withdrawn():
                continue
            if entry.priority is PriorityClass.BATCH:
                candidates = roomy
            exclude = item.exclude
            allowed = [c for c in candidates if c.instance_id not in exclude] if exclude else candidates
            self._commit(entry, picker.choose(item.request, allowed or candidates), now)
            views = None  # the dispatch changed an instance's load
        return Stop.EMPTY
