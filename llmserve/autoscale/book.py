"""The one owner of a pool's instance records: who they are, their state, and what happened.

An :class:`InstanceBook` holds the instances not yet gone, the last ones that are,
the history of their events, and moves an instance between states only through
:func:`~llmserve.lifecycle.check_transition`. The live controller keeps
:class:`~llmserve.autoscale.managed.ManagedInstance` records in one and the
simulator its :class:`~llmserve.sim.instance.SimInstance` records; nothing else
sets an instance's state. Listeners hear every transition (metrics, a log, the
simulator's core-sharing tally).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, Protocol, TypeVar

from llmserve.autoscale.history import History
from llmserve.autoscale.reconcile import InstanceStatus
from llmserve.lifecycle import InstanceState, check_transition


class Record(Protocol):
    id: Any
    state: InstanceState
    since: float
    reason: str
    capacity_class: str
    reclaim_at: float | None


R = TypeVar("R", bound=Record)
Listener = Callable[[Any, InstanceState, InstanceState, float], None]  # (record, old, new, now)


class InstanceBook(Generic[R]):
    def __init__(self, clock: Callable[[], float], wall: Callable[[], float], history: History | None = None,
                 keep_finished: int | None = 100) -> None:
        self.clock = clock
        self.wall = wall
        self.history = history  # None: events are not kept (the simulator's long days)
        self.instances: dict[Hashable, R] = {}  # not yet stopped or failed
        self.finished: deque[R] = deque(maxlen=keep_finished)
        self.listeners: list[Listener] = []

    def event(self, iid: Hashable, kind: str, old: str | None, new: str, reason: str, **details: Any) -> None:
        if self.history is not None:
            self.history.event(self.wall(), str(iid), kind, old, new, reason, **details)

    def add(self, rec: R, reason: str, **details: Any) -> R:
        self.instances[rec.id] = rec
        self.event(rec.id, "transition", None, rec.state.value, reason, **details)
        return rec

    def transition(self, rec: R, new: InstanceState, reason: str, **details: Any) -> None:
        old = rec.state
        check_transition(old, new)
        now = self.clock()
        rec.state, rec.since, rec.reason = new, now, reason
        self.event(rec.id, "transition", old.value, new.value, reason, **details)
        for listen in self.listeners:
            listen(rec, old, new, now)
        if not new.billed:
            self.instances.pop(rec.id, None)
            self.finished.append(rec)

    # ---- reading ---------------------------------------------------------------------------
    def get(self, iid: Hashable) -> R | None:
        return self.instances.get(iid)

    def find(self, iid: Hashable) -> R | None:
        """An instance still held, or one of the last gone."""
        return self.instances.get(iid) or next((i for i in self.finished if i.id == iid), None)

    def __iter__(self):
        return iter(list(self.instances.values()))

    def __len__(self) -> int:
        return len(self.instances)

    def in_state(self, *states: InstanceState) -> list[R]:
        return [i for i in self.instances.values() if i.state in states]

    def counts(self) -> dict[InstanceState, int]:
        out = {s: 0 for s in InstanceState}
        for i in self.instances.values():
            out[i.state] += 1
        return out

    def provisioned(self) -> int:
        return sum(1 for i in self.instances.values() if i.state.provisioned)

    def statuses(self, in_flight: Callable[[R], int]) -> list[InstanceStatus]:
        """What reconciliation sees: instances not on their way out (stopping, or under
        a reclaim notice: its replacement is already on its way)."""
        return [InstanceStatus(i.id, i.state, in_flight(i), i.since) for i in self.instances.values()
                if i.state is not InstanceState.STOPPING and i.reclaim_at is None]

    def classes(self) -> dict[Hashable, str]:
        return {i.id: i.capacity_class for i in self.instances.values()}

    def class_counts(self, classes: Iterable[str]) -> dict[str, int]:
        """Instances held (billed) by class."""
        out = {c: 0 for c in classes}
        for i in self.instances.values():
            if i.state.billed:
                out[i.capacity_class] += 1
        return out
