"""A pool: one model version's upstream instances and its admission queue.

The pool is the seam between the pure decision code and the live gateway. The
request path calls ``acquire`` (wait in the admission queue until the picker finds
an instance with room; the slot is reserved before the caller wakes) and
``release`` (the outcome feeds the instance's breaker and the outlier detector).

The autoscaler and the admin API change the instance set at run time through a
small interface; all of it is safe to call from the event loop at any moment:

- ``add_instance(url, instance_id=None, ready=False) -> Upstream``
- ``remove_instance(instance_id) -> Upstream``  (in-flight requests finish)
- ``set_draining(instance_id, draining=True)``   (no new requests; False: accepting again)
- ``set_ready(instance, ready)``                  (the monitor's ``/ready`` checks)
- ``instances() -> list[Upstream]``, ``get(instance_id)``
- ``stats() -> PoolStats``                        (queue depth, wait, in flight, totals)
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from llmserve.gateway.adapter_load import Residency, adapters_of
from llmserve.gateway.admission import (AdmissionConfig, AdmissionQueue, ClassStats,
                                        ConcurrencyConfig, Rejected, Ticket)
from llmserve.gateway.balancer import BalancerConfig, Picker, RouteRequest
from llmserve.gateway.circuit import BreakerConfig, BreakerState, CircuitBreaker
from llmserve.gateway.config import normalize_url
from llmserve.gateway.dispatch import Dispatcher, Stop
from llmserve.gateway.health import OutlierConfig, OutlierDetector
from llmserve.gateway.instance import InstanceView
from llmserve.gateway.pool_errors import NoHealthyInstance, QueueFull, QueueTimeout
from llmserve.load_report import LoadReport, MetricsLoadParser
from llmserve.priority import PriorityClass


class Outcome(enum.Enum):
    SUCCESS = "success"
    FAILURE = "failure"  # connection error, 5xx, or the stream broke: counts against it
    NEUTRAL = "neutral"  # the client went away: says nothing about the instance


@dataclass(eq=False)
class Upstream:
    """What routing needs of one upstream instance (owned by its pool).

    No lifecycle here: that is its controller's (:mod:`llmserve.autoscale.book`).
    The pool keeps only what routing reads: ``accepting`` (the owner lets new
    requests come; False while it drains), ``ready`` (the last ``/ready`` check)
    and ``has_been_ready`` (one passed once: requests wait for an instance that
    never passed yet, and fail fast when only failing ones are left), the breaker
    and the outlier detector (its health) and its load.
    """

    instance_id: str
    url: str
    breaker: CircuitBreaker
    ready: bool = False
    accepting: bool = True
    has_been_ready: bool = False
    inflight: int = 0
    report: LoadReport | None = None
    inflight_at_report: int = 0
    report_at: float = 0.0  # monotonic time the report arrived
    report_asked_at: float = 0.0  # and when it was asked for
    residency: Residency = field(default_factory=Residency)  # LoRA adapters beyond the report's
    poll_failures: int = 0
    load_source: str = "load"  # "load" or "metrics"
    ready_path: str = "/ready"  # "/health" for upstreams without /ready
    metrics_parser: MetricsLoadParser | None = None
    served: int = 0

    def snapshot(self, now: float, ejected: bool, report_ttl_s: float) -> dict:
        return {
            "instance_id": self.instance_id, "url": self.url, "ready": self.ready,
            "draining": not self.accepting, "ejected": ejected, "inflight": self.inflight,
            "breaker": self.breaker.state(now).value, "served": self.served,
            "load_source": self.load_source,
            "adapters": sorted(frozenset().union(*adapters_of(self))),
            "report": (self.report.model_dump()
                       if self.report is not None and now - self.report_at <= report_ttl_s
                       else None),
        }


@dataclass
class Lease:
    """A reserved slot on an instance for one attempt of one request."""

    instance: Upstream
    queued_s: float
    released: bool = False


@dataclass(eq=False)
class _Waiter:
    future: asyncio.Future
    request: RouteRequest
    exclude: frozenset[str] = field(default_factory=frozenset)

    def withdrawn(self) -> bool:
        return self.future.done()  # cancelled, or failed while it waited


@dataclass(frozen=True, slots=True)
class Waiting:
    """A queued request (from ``Pool.enqueue``)."""

    waiter: _Waiter
    ticket: int

    @property
    def done(self) -> bool:
        return self.waiter.future.done()

    def result(self) -> Lease:
        return self.waiter.future.result()


@dataclass(frozen=True, slots=True)
class PoolStats:
    """What the autoscaler reads of a pool."""

    instances: int
    routable: int
    inflight: int
    queue_depth: dict[str, int]
    queue_oldest_wait_s: dict[str, float]
    admitted_total: int  # counters since start: the caller takes rates from differences
    rejected_total: int
    dispatched_total: int


class Pool:
    def __init__(self, name: str, *, admission: AdmissionConfig | None = None,
                 concurrency: ConcurrencyConfig | None = None,
                 balancer: BalancerConfig | None = None, breaker: BreakerConfig | None = None,
                 outlier: OutlierConfig | None = None, report_ttl_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        self.name = name
        self.admission: AdmissionQueue[_Waiter] = AdmissionQueue(admission)
        self.picker = Picker(balancer, concurrency, rng=rng)
        self._dispatcher = Dispatcher(self.admission, self.picker, self.views, self._commit, self._broken)
        self.outlier = OutlierDetector(outlier)
        self._breaker_config = breaker or BreakerConfig()
        self._report_ttl_s = report_ttl_s
        self._clock = clock
        self._instances: dict[str, Upstream] = {}
        self._ids = itertools.count(1)
        # Set by the pool's elastic controller: it can start instances, so a pool with
        # nothing routable but draining instances queues (it revives or starts one)
        # instead of failing fast, and an empty one queues as it always does.
        self.can_grow = False
        self.failed: str | None = None  # why its controller gave up starting instances (set_failed)

    # ---- the run-time interface (autoscaler, admin API) -----------------------------
    def add_instance(self, url: str, instance_id: str | None = None, *,
                     ready: bool = False) -> Upstream:
        """Add an upstream; it takes traffic once ready (``/ready`` passes)."""
        url, instance_id = self.check_new(url, instance_id)
        inst = Upstream(instance_id, url, CircuitBreaker(self._breaker_config), ready=ready, has_been_ready=ready)
        self._instances[instance_id] = inst
        self.pump()
        return inst

    def check_new(self, url: str, instance_id: str | None = None) -> tuple[str, str]:
        """The normalised URL and the id an instance would be added under; ValueError
        if either is taken."""
        url = normalize_url(url)
        if any(i.url == url for i in self._instances.values()):
            raise ValueError(f"{url} is already in pool {self.name}")
        instance_id = instance_id or url.split("://", 1)[1].replace("/", "_")
        if instance_id in self._instances:
            raise ValueError(f"instance id {instance_id!r} is already in pool {self.name}")
        return url, instance_id

    def remove_instance(self, instance_id: str) -> Upstream:
        """Take an instance out at once; its in-flight requests run to completion."""
        inst = self._instances.pop(instance_id)
        self.outlier.forget(instance_id)
        prefix = self.picker.scorer("prefix")
        if prefix is not None:
            prefix.forget(instance_id)  # type: ignore[attr-defined]
        return inst

    def set_draining(self, instance_id: str, draining: bool = True) -> None:
        """No new requests (draining), or accepting them again (routable once its
        ``/ready`` check passes; one taken back unready waits as a new one)."""
        inst = self._instances[instance_id]
        if not draining and not inst.accepting and not inst.ready:
            inst.has_been_ready = False
        inst.accepting = not draining
        self.pump()

    def set_ready(self, inst: Upstream, ready: bool) -> None:
        """What the last ``/ready`` check (or a refused poll) said; the first pass ends
        the instance's start."""
        inst.ready = ready
        if ready:
            inst.has_been_ready = True
            self.pump()

    def set_failed(self, why: str | None) -> None:
        """Its controller gave up starting instances (None: it tries again): with nothing
        routable, what waits and what comes fails at once, saying ``why``."""
        self.failed = why
        self.pump()

    def instances(self) -> list[Upstream]:
        return list(self._instances.values())

    def get(self, instance_id: str) -> Upstream | None:
        return self._instances.get(instance_id)

    def stats(self) -> PoolStats:
        now = self._clock()
        stats = self.admission.stats(now)
        views = self.views(now)
        return PoolStats(
            instances=len(views), routable=sum(v.routable for v in views),
            inflight=sum(i.inflight for i in self._instances.values()),
            queue_depth={p.name.lower(): s.depth for p, s in stats.items()},
            queue_oldest_wait_s={p.name.lower(): s.oldest_wait_s for p, s in stats.items()},
            admitted_total=sum(s.admitted for s in stats.values()),
            rejected_total=sum(s.rejected for s in stats.values()),
            dispatched_total=sum(s.dispatched for s in stats.values()))

    def cold(self) -> bool:
        """No instance could take a request now (none, or none ready): a request
        queued now waits for a start (scale from zero) or a revival."""
        return not any(i.ready and i.accepting for i in self._instances.values())

    def capacity_shortfall(self) -> str | None:
        """Why an elastic pool cannot be judged on its requests now, if it cannot: no
        ready instance, or a queue behind healthy instances (waiting for a start).
        A queue behind tripped breakers or ejected instances is its own failing."""
        if not self.can_grow:
            return None  # a fixed pool's shortfalls are its own
        if self.cold():
            return "has no ready instance (starting, warming or scaled to zero)"
        queued = len(self.admission)
        now = self._clock()
        if queued and all(v.routable for v in self.views(now) if v.ready and v.accepting):
            return f"queued for capacity ({queued} waiting)"
        return None

    def queue_stats(self) -> dict[PriorityClass, ClassStats]:
        return self.admission.stats(self._clock())

    def snapshot(self) -> list[dict]:
        now = self._clock()
        return [i.snapshot(now, self.outlier.is_ejected(i.instance_id, now), self._report_ttl_s)
                for i in self._instances.values()]

    # ---- the request path -------------------------------------------------------------
    def views(self, now: float) -> list[InstanceView]:
        return [self._view(i, now) for i in self._instances.values()]

    def _view(self, i: Upstream, now: float) -> InstanceView:
        fresh = i.report is not None and now - i.report_at <= self._report_ttl_s
        resident, loaded = i.residency.view(i.report if fresh else None, i.report_asked_at, now)
        return InstanceView(
            instance_id=i.instance_id, url=i.url, ready=i.ready,
            healthy=not self.outlier.is_ejected(i.instance_id, now), accepting=i.accepting,
            has_been_ready=i.has_been_ready,
            breaker_available=i.breaker.available(now), inflight=i.inflight,
            inflight_at_report=i.inflight_at_report if fresh else 0,
            report=i.report if fresh else None, adapters=resident, adapters_loaded=loaded)

    async def acquire(self, request: RouteRequest, priority: PriorityClass,
                      exclude: Iterable[str] = ()) -> Lease:
        """Wait for a slot on an instance. Raises QueueFull (429), QueueTimeout (503) or
        NoHealthyInstance (503)."""
        return await self.wait(self.enqueue(request, priority, exclude))

    def enqueue(self, request: RouteRequest, priority: PriorityClass,
                exclude: Iterable[str] = ()) -> Waiting:
        """Queue a request and dispatch what can go now; ``waiting.done`` is True when it
        already has a slot (the common case), so the caller can skip the wait."""
        now = self._clock()
        views = self.views(now)
        if self._broken(views):
            raise self._broken_error(now)
        waiter = _Waiter(asyncio.get_running_loop().create_future(), request, frozenset(exclude))
        result = self.admission.offer(waiter, priority, now)
        if isinstance(result, Rejected):
            raise QueueFull(result)
        self.pump(now, views)
        return Waiting(waiter, result.ticket)

    async def wait(self, waiting: Waiting) -> Lease:
        """Wait for the slot; cancelling the wait withdraws the request (or frees its slot)."""
        fut = waiting.waiter.future
        try:
            while not fut.done():
                deadline = self.admission.next_deadline()
                timeout = None if deadline is None else max(0.0, deadline - self._clock()) + 1e-3
                await asyncio.wait({fut}, timeout=timeout)
                if not fut.done():
                    self.pump()  # a deadline passed: expire whoever is due
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release(fut.result(), Outcome.NEUTRAL)
            else:
                self.admission.remove(waiting.ticket)
                fut.cancel()
            raise
        return fut.result()

    def release(self, lease: Lease, outcome: Outcome) -> None:
        if lease.released:
            return
        lease.released = True
        inst, now = lease.instance, self._clock()
        inst.inflight -= 1
        if outcome is not Outcome.NEUTRAL:
            ok = outcome is Outcome.SUCCESS
            if ok:
                inst.breaker.record_success(now)
            else:
                inst.breaker.record_failure(now)
            if inst.instance_id in self._instances:
                self.outlier.record(inst.instance_id, ok, now, len(self._instances))
        self.pump()

    def breaker_states(self) -> dict[str, BreakerState]:
        now = self._clock()
        return {i.instance_id: i.breaker.state(now) for i in self._instances.values()}

    def pump(self, now: float | None = None, views: list[InstanceView] | None = None) -> None:
        """Dispatch waiting requests to instances with room; expire overdue ones.
        ``views`` (taken at ``now``) saves the caller's snapshot being taken again."""
        if now is None:
            now = self._clock()
        self._expire(now)
        if self._dispatcher.run(now, views) is Stop.BROKEN:
            for e in self.admission.expire(float("inf")):
                if not e.entry.item.future.done():
                    e.entry.item.future.set_exception(self._broken_error(now))
        self._expire(now)

    def _commit(self, entry: Ticket[_Waiter], view: InstanceView, now: float) -> None:
        inst = self._instances[view.instance_id]
        inst.breaker.acquire(now)
        inst.inflight += 1
        inst.served += 1
        adapter = entry.item.request.adapter
        if adapter is not None and adapter not in view.adapters and adapter not in view.adapters_loaded:
            inst.residency.claim(adapter, now)  # the next requests for it follow this one here
        entry.item.future.set_result(Lease(inst, now - entry.enqueued_at))

    def _broken(self, views: Sequence[InstanceView]) -> bool:
        if any(v.routable for v in views):
            return False
        if self.failed is not None:
            return True  # its controller gave up starting instances
        if not views:
            return False
        if self.can_grow and not any(v.accepting and v.ready for v in views):
            return False  # gone or dead (not ready): its owner replaces it, so wait for that one
        # Fail fast only where every instance has been ready once: one still starting may come.
        return all(v.has_been_ready or not v.accepting for v in views)

    def _broken_error(self, now: float) -> NoHealthyInstance:
        if self.failed is not None:
            return NoHealthyInstance(self.failed, 60, "pool_failed")  # not back before an operator acts
        waits = [w for i in self._instances.values() if (w := i.breaker.reopens_in(now)) > 0]
        return NoHealthyInstance(f"no healthy instance in pool {self.name}: every instance is failing, "
                                 "not ready or draining", math.ceil(min(waits, default=5.0)))

    def _expire(self, now: float) -> None:
        expired = self.admission.expire(now)
        if not expired:
            return
        _, why_not = self.picker.candidates(self.views(now))
        for e in expired:
            if not e.entry.item.future.done():
                detail = f" ({why_not.value})" if why_not is not None else ""
                e.entry.item.future.set_exception(
                    QueueTimeout(f"{e.reason}{detail}", e.waited_s))
