"""Dispatch: queued requests to instances with room, in one order for every caller.

The live pool (:meth:`~llmserve.gateway.pool.Pool.pump`) and the simulator's
gateway (:class:`~llmserve.sim.gateway.SimGateway`) both run :class:`Dispatcher`,
so a simulated request waits, and lands, where a live one would. Each round:

1. the candidates: routable instances (ready, healthy, not draining, breaker
   closed or its half-open probe free) with room, from the caller's views (of a
   large pool, from a random draw: see :mod:`~llmserve.gateway.balancer.picker`);
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

The picker filters once per round (``candidates``, then ``choose`` on those);
batch room is looked for only while a batch request waits.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Sequence
from typing import Generic, Protocol, TypeVar

from llmserve.gateway.admission import AdmissionQueue, Ticket
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
_BATCH = PriorityClass.BATCH  # read every round: an enum class's member is a slow attribute
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
            # Batch room is looked for only when a batch request waits (else it decides nothing).
            roomy = (picker.candidates(views, batch=True)[0]
                     if candidates and queue.depth(_BATCH) else [])
            entry = queue.next_to_dispatch(now, bool(candidates), bool(roomy))
            if entry is None:
                # with room for both classes, only expiries are left
                return Stop.NO_ROOM if not candidates or len(queue) else Stop.EMPTY
            item = entry.item
            if item.withdrawn():
                continue
            batch = entry.priority is _BATCH
            if batch:
                candidates = roomy
            exclude = item.exclude
            if exclude:  # a retry avoids these unless only they have room: look at the whole pool
                candidates = picker.candidates(views, batch=batch, sample=False)[0]
                allowed = [c for c in candidates if c.instance_id not in exclude] or candidates
            else:
                allowed = picker.with_affinity(item.request, candidates, views, batch)
            self._commit(entry, picker.choose(item.request, allowed), now)
            views = None  # the dispatch changed an instance's load
        return Stop.EMPTY
