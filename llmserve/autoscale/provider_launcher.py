"""The live executor's two sides: instances started and stopped through a provider,
and the gateway pool told what routing needs.

:class:`ProviderLauncher` runs each start and stop as a task and reports its end
to the :class:`~llmserve.autoscale.executor.Executor` through the callbacks it is
given. :class:`PoolRouter` adds a ready instance to the gateway's pool, takes it
out, and marks it accepting or not; the pool keeps no lifecycle of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace

from llmserve.autoscale.book import InstanceBook
from llmserve.autoscale.capacity_classes import ON_DEMAND, SPOT
from llmserve.autoscale.effects import Start
from llmserve.autoscale.managed import ManagedInstance
from llmserve.autoscale.providers.base import InstanceHandle, InstanceProvider, InstanceSpec, SpotUnavailable
from llmserve.gateway.pool import Pool
from llmserve.lifecycle import InstanceState

log = logging.getLogger("llmserve.autoscale.controller")
S = InstanceState


@dataclass(frozen=True, slots=True)
class LaunchReports:
    """Where a launcher reports the end of its work (the executor's methods)."""

    started: Callable[[ManagedInstance], None]
    start_failed: Callable[[ManagedInstance, str], None]
    exited: Callable[[ManagedInstance, str, int | None], None]
    spot_refused: Callable[[ManagedInstance, str], None]


class ProviderLauncher:
    def __init__(self, book: InstanceBook, provider: InstanceProvider, spec_factory: Callable[[str], InstanceSpec],
                 stop_grace_s: float, name: str) -> None:
        self.book = book
        self.provider = provider
        self.spec_factory = spec_factory
        self.stop_grace_s = stop_grace_s
        self.name = name
        self.reports: LaunchReports | None = None  # set once the executor exists
        self.tasks: dict[Hashable, asyncio.Task] = {}  # a start or stop in progress, by instance id

    def create(self, iid: Hashable, now: float, start: Start) -> ManagedInstance:
        return ManagedInstance(str(iid), S.STARTING, now, self.book.wall(), now, start.reason,
                               replaces=start.replaces, capacity_class=start.capacity_class)

    def launch(self, rec: ManagedInstance) -> None:
        self.tasks[rec.id] = asyncio.create_task(self._start(rec), name=f"start {rec.id}")

    def stopping(self, rec: ManagedInstance) -> bool:
        return rec.id in self.tasks

    def halt(self, rec: ManagedInstance, reason: str) -> None:
        pending = self.tasks.get(rec.id)
        if pending is not None and rec.handle is None:
            pending.cancel()  # a start still waiting for its address
            self.tasks.pop(rec.id, None)
        self.tasks[rec.id] = asyncio.create_task(self._stop(rec, reason), name=f"stop {rec.id}")

    def release(self, rec: ManagedInstance, reason: str) -> None:
        """After a failure: cancel a start without an address, else stop what runs."""
        if rec.handle is None and rec.id not in self.tasks:
            return
        pending = self.tasks.pop(rec.id, None)
        if pending is not None and rec.handle is None:
            pending.cancel()
        else:
            self.tasks[rec.id] = asyncio.create_task(self._stop(rec, reason), name=f"cleanup {rec.id}")

    async def _start(self, rec: ManagedInstance) -> None:
        try:
            handle = await self._provider_start(rec)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - any start failure fails the instance
            self.tasks.pop(rec.id, None)
            self.reports.start_failed(rec, f"start failed: {type(e).__name__}: {e}")
            return
        self.tasks.pop(rec.id, None)
        rec.handle = handle
        self.book.event(rec.id, "started", rec.state.value, rec.state.value,
                        f"{self.provider.name} provider: {handle.url}", **handle.ref)
        self.reports.started(rec)

    async def _provider_start(self, rec: ManagedInstance) -> InstanceHandle:
        """Start in the instance's class; refused spot falls back to on-demand at once."""
        spec = replace(self.spec_factory(rec.id), capacity_class=rec.capacity_class)
        try:
            return await self.provider.start(spec)
        except SpotUnavailable as e:
            if rec.capacity_class != SPOT:
                raise
            self.reports.spot_refused(rec, f"spot refused ({e}); starting on-demand instead")
            rec.capacity_class = ON_DEMAND
            return await self.provider.start(replace(spec, capacity_class=ON_DEMAND))

    async def _stop(self, rec: ManagedInstance, reason: str) -> None:
        code = None
        if rec.handle is not None:
            try:
                code = await self.provider.stop(rec.handle, self.stop_grace_s)
            except Exception as e:  # noqa: BLE001
                log.warning("%s: stopping %s failed: %s", self.name, rec.id, e)
        self.tasks.pop(rec.id, None)
        self.reports.exited(rec, reason, code)


class PoolRouter:
    """The gateway pool's side of the executor: membership, accepting, counts."""

    def __init__(self, book: InstanceBook, pool: Pool) -> None:
        self.book = book
        self.pool = pool

    def join(self, rec: ManagedInstance) -> str | None:
        assert rec.handle is not None and rec.state is S.READY
        try:
            self.pool.add_instance(rec.handle.url, rec.id, ready=True)
        except ValueError as e:  # its URL or id is already taken in the pool
            return str(e)
        rec.in_pool = True
        now = self.book.clock()
        self.book.event(rec.id, "pool_add", S.READY.value, S.READY.value, "takes traffic from now on",
                        url=rec.handle.url, cold_start_s=now - rec.created)
        return None

    def leave(self, rec: ManagedInstance, reason: str) -> None:
        if not rec.in_pool:
            return
        seen = self.pool.get(rec.id)
        if seen is not None:
            self.pool.remove_instance(rec.id)
            rec.served = seen.served  # the pool's record goes with it
        rec.in_pool = False
        self.book.event(rec.id, "pool_remove", rec.state.value, rec.state.value, reason,
                        in_flight=seen.inflight if seen is not None else 0, served=rec.served)

    def accepting(self, rec: ManagedInstance, accepting: bool) -> None:
        if self.pool.get(rec.id) is not None:
            self.pool.set_draining(rec.id, not accepting)

    def in_flight(self, rec: ManagedInstance) -> int:
        seen = self.pool.get(rec.id)
        return seen.inflight if seen is not None else 0

    def served(self, rec: ManagedInstance) -> int:
        seen = self.pool.get(rec.id)
        return seen.served if seen is not None else rec.served

    def failed(self, why: str | None) -> None:
        self.pool.set_failed(why)
