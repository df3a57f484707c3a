"""The dispatcher the live pool and the simulator's gateway share: pop, then pick."""

from __future__ import annotations

import random
from dataclasses import dataclass

from llmserve.gateway.admission import AdmissionQueue, ConcurrencyConfig
from llmserve.gateway.balancer import Picker, RouteRequest
from llmserve.gateway.dispatch import Dispatcher, Stop
from llmserve.gateway.instance import InstanceView
from llmserve.priority import PriorityClass

RT, BATCH = PriorityClass.REALTIME, PriorityClass.BATCH


@dataclass(eq=False)
class Item:
    name: str
    exclude: frozenset[str] = frozenset()
    gone: bool = False
    request: RouteRequest = RouteRequest()

    def withdrawn(self) -> bool:
        return self.gone


class Harness:
    """Instances with room for ``room`` requests each; commits are counted, not sent."""

    def __init__(self, *ids: str, room: int = 1, broken: bool = False, reserve: float = 0.25) -> None:
        self.inflight = {i: 0 for i in ids}
        self.down: set[str] = set()
        self.sent: list[tuple[str, str]] = []
        self.queue: AdmissionQueue[Item] = AdmissionQueue()
        picker = Picker(concurrency=ConcurrencyConfig(fixed=room, realtime_reserve=reserve), rng=random.Random(0))
        self.dispatcher = Dispatcher(self.queue, picker, self.views, self.commit,
                                     (lambda views: True) if broken else None)

    def views(self, now: float) -> list[InstanceView]:
        return [InstanceView(i, inflight=n, breaker_available=i not in self.down) for i, n in self.inflight.items()]

    def commit(self, ticket, view: InstanceView, now: float) -> None:
        self.inflight[view.instance_id] += 1
        self.sent.append((ticket.item.name, view.instance_id))

    def offer(self, *items: Item, priority: PriorityClass = RT) -> None:
        for it in items:
            self.queue.offer(it, priority, 0.0)


def test_requests_go_in_queue_order_until_no_instance_has_room():
    h = Harness("a", "b")
    h.offer(Item("r1"), Item("r2"), Item("r3"))
    assert h.dispatcher.run(1.0) is Stop.NO_ROOM
    assert [name for name, _ in h.sent] == ["r1", "r2"]
    assert sorted(i for _, i in h.sent) == ["a", "b"]
    assert len(h.queue) == 1  # never popped without a place to go
    h.inflight["a"] = 0
    assert h.dispatcher.run(2.0) is Stop.EMPTY and h.sent[-1] == ("r3", "a")


def test_exclude_is_honoured_unless_only_excluded_instances_have_room():
    h = Harness("a", "b")
    h.offer(Item("retry", exclude=frozenset({"a"})))
    h.dispatcher.run(1.0)
    assert h.sent == [("retry", "b")]
    h.offer(Item("again", exclude=frozenset({"a"})))
    h.dispatcher.run(2.0)
    assert h.sent[-1] == ("again", "a")  # b is full: a retry beats a wait


def test_an_open_breaker_keeps_requests_away_and_a_withdrawn_request_is_skipped():
    h = Harness("a", "b", room=4)
    h.down.add("a")
    h.offer(Item("gone", gone=True), Item("r1"), Item("r2"))
    h.dispatcher.run(1.0)
    assert h.sent == [("r1", "b"), ("r2", "b")]


def test_a_broken_pool_stops_the_run_without_popping():
    h = Harness("a", broken=True)
    h.down.add("a")
    h.offer(Item("r1"))
    assert h.dispatcher.run(1.0) is Stop.BROKEN and len(h.queue) == 1 and not h.sent


def test_batch_gets_its_share_while_realtime_waits():
    h = Harness("a", room=10, reserve=0.0)
    h.offer(*(Item(f"rt{k}") for k in range(8)))
    h.offer(*(Item(f"b{k}") for k in range(2)), priority=BATCH)
    h.dispatcher.run(1.0)
    order = [name for name, _ in h.sent]
    assert order[4] == "b0" and order.count("b0") + order.count("b1") == 2  # share 0.2: every fifth


def test_batch_leaves_the_realtime_reserve_free():
    """Issue 33: a batch backlog never takes the last seats, so realtime finds one at once."""
    h = Harness("a", room=8)  # reserve 0.25: batch may hold 6 of the 8
    h.offer(*(Item(f"b{k}") for k in range(10)), priority=BATCH)
    assert h.dispatcher.run(1.0) is Stop.NO_ROOM and len(h.sent) == 6 and len(h.queue) == 4
    h.offer(Item("rt0"), Item("rt1"), Item("rt2"))
    h.dispatcher.run(2.0)
    assert [name for name, _ in h.sent[6:]] == ["rt0", "rt1"]  # the reserve, then full
    one = Harness("a", room=1)  # a reserve rounds down: one seat is batch's too
    one.offer(Item("b0"), priority=BATCH)
    one.dispatcher.run(1.0)
    assert one.sent == [("b0", "a")]
