"""The simulated gateway: llmserve's own admission queues and balancer, fed by the simulator.

Nothing here decides anything: :class:`~llmserve.gateway.admission.AdmissionQueue`
holds requests until an instance has room, and the live pool's own
:class:`~llmserve.gateway.dispatch.Dispatcher` pops them and has the
:class:`~llmserve.gateway.balancer.Picker` choose the instance, in the live
order. This module only does what the live gateway's I/O layer does: it
keeps each instance's last load report and its own in-flight count, and turns
them into the :class:`~llmserve.gateway.instance.InstanceView` s the picker reads.

Load reports are refreshed every poll interval, as the live gateway polls
``/load``; between polls the picker sees the gateway's exact in-flight counts
(the ``inflight`` correction in ``InstanceView``), as it does live.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

from llmserve.gateway.admission import AdmissionConfig, AdmissionQueue, Admitted, ConcurrencyConfig, Ticket
from llmserve.gateway.balancer import BalancerConfig, Picker, RouteRequest
from llmserve.gateway.dispatch import Dispatcher
from llmserve.gateway.instance import InstanceView
from llmserve.load_report import LoadReport
from llmserve.priority import PriorityClass
from llmserve.sim.instance import SimInstance

# Simulated requests carry no prompt text, so every request looks the same to the
# balancer (the prefix scorer finds nothing); one RouteRequest serves them all.
_ROUTE = RouteRequest()
PRIORITIES = (PriorityClass.REALTIME, PriorityClass.BATCH)
# The report's optional fields, given: model_construct inspects a default factory's signature
# for each one left out (pydantic 2.x), 30 times the cost of the whole report. So every field
# is given (tests/sim/test_simulator.py checks): one left out was half a simulated day's run.
_UNSAID = {"state": None, "step_costs": None, "threads": None}
Deliver = Callable[[int, SimInstance, float], None]


class _Request:
    """A queued simulated request, as the dispatcher reads it: no retries to steer
    (nothing excluded) and no client that goes away."""

    __slots__ = ("rid", "request")
    exclude: tuple[str, ...] = ()

    def __init__(self, rid: int, request: RouteRequest = _ROUTE) -> None:
        self.rid = rid
        self.request = request

    def withdrawn(self) -> bool:
        return False


class _Routed:
    """The gateway's book on one routable instance."""

    __slots__ = ("inst", "sid", "report", "inflight_at_report", "history")

    def __init__(self, inst: SimInstance) -> None:
        self.inst = inst
        self.sid = str(inst.id)
        self.report: LoadReport | None = None
        self.inflight_at_report = 0
        self.history: deque[tuple[float, int, int, float]] = deque()


class SimGateway:
    """Admission, balancing and load reports for one simulated pool."""

    def __init__(self, deliver: Deliver, admission: AdmissionConfig | None = None,
                 concurrency: ConcurrencyConfig | None = None, balancer: BalancerConfig | None = None,
                 seed: int = 0, model: str = "sim", rate_window_s: float = 10.0) -> None:
        self.admission: AdmissionQueue[_Request] = AdmissionQueue(admission or AdmissionConfig())
        self.picker = Picker(balancer or BalancerConfig(), concurrency or ConcurrencyConfig(),
                             random.Random(seed))
        self._deliver = deliver  # (request id, instance, now): the simulator starts it there
        self._dispatcher = Dispatcher(self.admission, self.picker, self._views, self._commit)
        self.model = model
        self.rate_window_s = rate_window_s
        self._routed: dict[str, _Routed] = {}
        # The views as the picker reads them, in pool order; a changed instance's entry is
        # rebuilt on the next read, not the whole list (a round at 500 instances reads one or two).
        self._list: list[InstanceView] = []
        self._rows: list[_Routed] = []  # the books behind them, in the same order
        self._slot: dict[str, int] = {}
        self._stale: set[int] = set()
        self.queued = 0  # requests in the admission queue (kept here: len() of it walks both classes)
        self._routes: dict[str, RouteRequest] = {}  # one per adapter

    # ---- pool membership (the controller's decisions) ---------------------------------------
    def add_instance(self, inst: SimInstance, now: float) -> None:
        r = _Routed(inst)
        self._routed[r.sid] = r
        self._refresh(r, now)
        self._relist()

    def remove_instance(self, inst: SimInstance) -> None:
        if self._routed.pop(str(inst.id), None) is not None:
            self._relist()

    def _relist(self) -> None:
        self._slot = {sid: k for k, sid in enumerate(self._routed)}
        self._rows = list(self._routed.values())
        self._list = [self._view(r) for r in self._rows]
        self._stale.clear()

    def _invalidate(self, r: _Routed) -> None:
        k = self._slot.get(r.sid)
        if k is not None:
            self._stale.add(k)

    # ---- requests -----------------------------------------------------------------------------
    def offer(self, rid: int, priority: PriorityClass, now: float, adapter: str | None = None) -> bool:
        """Queue a request (on ``adapter``, None: the base); False when the admission
        queue rejects it (the live gateway's 429)."""
        route = _ROUTE if adapter is None else self._routes.setdefault(adapter, RouteRequest(adapter=adapter))
        if isinstance(self.admission.offer(_Request(rid, route), priority, now), Admitted):
            self.queued += 1
            return True
        return False

    def queue_depth(self) -> dict[str, int]:
        return {p.name.lower(): self.admission.depth(p) for p in PRIORITIES}

    def dispatch(self, now: float) -> None:
        """Send what the queue holds to instances with room, as the live pool does."""
        if self.queued:
            self._dispatcher.run(now)

    def _views(self, now: float) -> list[InstanceView]:
        if self._stale:
            rows, views = self._rows, self._list
            for k in self._stale:
                views[k] = self._view(rows[k])
            self._stale.clear()
        return self._list

    def _commit(self, ticket: Ticket[_Request], view: InstanceView, now: float) -> None:
        self.queued -= 1
        r = self._routed[view.instance_id]
        self._invalidate(r)
        self._deliver(ticket.item.rid, r.inst, now)

    def changed(self, inst: SimInstance) -> None:
        """The instance's in-flight count changed (a request finished): rebuild its view."""
        r = self._routed.get(str(inst.id))
        if r is not None:
            self._invalidate(r)

    def expire(self, now: float) -> list[int]:
        """Requests past their queue deadline (the live gateway answers 503)."""
        gone = [e.entry.item.rid for e in self.admission.expire(now)]
        self.queued -= len(gone)
        return gone

    # ---- load reports -------------------------------------------------------------------------
    def poll(self, now: float) -> None:
        for r in self._routed.values():
            self._refresh(r, now)

    def reports(self) -> list[LoadReport]:
        return [r.report for r in self._routed.values() if r.report is not None]

    def _refresh(self, r: _Routed, now: float) -> None:
        inst = r.inst
        inst.sync(now)
        h = r.history
        h.append((now, inst.tokens_total, inst.gen_total, inst.busy_total))
        while len(h) > 2 and h[1][0] <= now - self.rate_window_s:
            h.popleft()
        t0, tok0, gen0, busy0 = h[0]
        dt = now - t0
        tps = (inst.tokens_total - tok0) / dt if dt > 0 else 0.0
        gps = (inst.gen_total - gen0) / dt if dt > 0 else 0.0
        busy = min(1.0, max(0.0, (inst.busy_total - busy0) / dt)) if dt > 0 else 0.0
        r.report = LoadReport.model_construct(
            instance_id=r.sid, model=self.model, ready=True, draining=False,
            num_running=len(inst.running), num_waiting=len(inst.waiting), num_waiting_by_priority={},
            kv_cache_usage=inst.kv_usage, busy_fraction=busy, tokens_per_s=tps,
            generation_tokens_per_s=gps, max_num_seqs=inst.profile.max_num_seqs,
            prefix_cache_hit_rate=0.0, timestamp=now, lora_adapters=[], lora_adapters_loaded=[],
            lora_adapters_registered=[], **_UNSAID)
        r.inflight_at_report = inst.in_flight
        self._invalidate(r)

    def _view(self, r: _Routed) -> InstanceView:
        # Its adapters as the live gateway knows its own loads: at once, not at the next poll.
        return InstanceView(instance_id=r.sid, inflight=r.inst.in_flight,
                            inflight_at_report=r.inflight_at_report, report=r.report,
                            adapters=r.inst.adapters.names())
