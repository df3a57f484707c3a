"""A pool controller's actions on its instances: launch, stop, fail and replace, join
and leave the gateway's pool, and the one place a state changes (``_transition``,
checked against the lifecycle table). Part of :class:`PoolController`, apart from
its observing and deciding."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from llmserve.autoscale.managed import ManagedInstance
from llmserve.lifecycle import InstanceState, check_transition

log = logging.getLogger("llmserve.autoscale.controller")
S = InstanceState


class InstanceActions:
    """What :class:`~llmserve.autoscale.controller.PoolController` does to instances."""

    def _launch(self, reason: str, now: float, replaces: str | None = None,
                capacity_class: str | None = None) -> ManagedInstance:
        iid = f"{self._prefix}{self._next_id}"
        self._next_id += 1
        cls = capacity_class or self._replacement_class(replaces)
        inst = ManagedInstance(iid, S.STARTING, now, self.wall(), now, reason, replaces=replaces, capacity_class=cls)
        self.instances[iid] = inst
        self.history.event(inst.created_wall, iid, "transition", None, S.STARTING.value, reason,
                           replaces=replaces, capacity_class=cls)
        self._tasks[iid] = asyncio.create_task(self._do_start(inst), name=f"start {iid}")
        return inst

    async def _do_start(self, inst: ManagedInstance) -> None:
        try:
            handle = await self._provider_start(inst)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - any start failure fails the instance
            self._tasks.pop(inst.id, None)
            if inst.state is S.STARTING:
                self._fail(inst, f"start failed: {type(e).__name__}: {e}")
            return
        self._tasks.pop(inst.id, None)
        inst.handle = handle
        self.history.event(self.wall(), inst.id, "started", inst.state.value, inst.state.value,
                           f"{self.provider.name} provider: {handle.url}", **handle.ref)
        if inst.state is S.STOPPING:  # cancelled while the provider was starting it
            self._begin_stop(inst, inst.reason)

    def _begin_stop(self, inst: ManagedInstance, reason: str, **details: Any) -> None:
        """Out of the pool and ``stopping``, then stop the process; ``stopped`` once it
        has exited. Called again for an instance already stopping whose start was still
        running, it sends the stop that start could not have been sent before."""
        stopping = inst.state is S.STOPPING
        if stopping and inst.id in self._tasks:
            return
        pending = self._tasks.get(inst.id)
        if pending is not None and inst.handle is None:
            pending.cancel()  # a start still waiting for its address
            self._tasks.pop(inst.id, None)
        self._leave_pool(inst, reason)
        if not stopping:
            self._transition(inst, S.STOPPING, reason, served=self._served(inst), **details)
        self._tasks[inst.id] = asyncio.create_task(self._do_stop(inst, reason), name=f"stop {inst.id}")

    async def _do_stop(self, inst: ManagedInstance, reason: str) -> None:
        code = None
        if inst.handle is not None:
            try:
                code = await self.provider.stop(inst.handle, self.config.stop_grace_s)
            except Exception as e:  # noqa: BLE001
                log.warning("%s: stopping %s failed: %s", self.key, inst.id, e)
        inst.exit_code = code
        self._tasks.pop(inst.id, None)
        if inst.state is S.FAILED:
            self.history.event(self.wall(), inst.id, "cleaned_up", S.FAILED.value, S.FAILED.value,
                               "process released", exit_code=code)
            return
        if inst.drain_started is not None and self.metrics is not None:  # it stopped after a drain
            self.metrics.drain.labels(self.model, self.version).observe(self.clock() - inst.drain_started)
        self._transition(inst, S.STOPPED, reason, exit_code=code)

    def _fail(self, inst: ManagedInstance, reason: str) -> None:
        provisioned = inst.state.provisioned
        never_ready = inst.ready_at is None
        self._leave_pool(inst, reason)
        self._transition(inst, S.FAILED, reason)
        log.warning("%s: instance %s failed: %s", self.key, inst.id, reason)
        if inst.handle is not None or inst.id in self._tasks:
            pending = self._tasks.pop(inst.id, None)
            if pending is not None and inst.handle is None:
                pending.cancel()
            else:
                self._tasks[inst.id] = asyncio.create_task(self._do_stop(inst, reason), name=f"cleanup {inst.id}")
        if never_ready:
            self._failures_before_ready += 1
            n = self._failures_before_ready
            backoff = min(self.config.max_restart_backoff_s, self.config.restart_backoff_s * 2 ** (n - 1))
            self._start_not_before = self.clock() + backoff
        if provisioned:
            self._replacements.append(inst.id)

    def _start_replacements(self, now: float) -> None:
        while self._replacements and now >= self._start_not_before:
            failed = self._replacements.popleft()
            if self.metrics is not None:
                self.metrics.replacements.labels(self.model, self.version).inc()
            self._launch(f"replaces {failed}, which failed", now, replaces=failed)

    def _join_pool(self, inst: ManagedInstance, now: float) -> None:
        assert inst.handle is not None and inst.state is S.READY
        try:
            self.pool.add_instance(inst.handle.url, inst.id, ready=True)
        except ValueError as e:  # its URL or id is already taken in the pool
            self._fail(inst, f"could not join the pool: {e}")
            return
        inst.in_pool = True
        inst.ready_at = now
        self._failures_before_ready = 0
        self._start_not_before = 0.0
        self.history.event(self.wall(), inst.id, "pool_add", S.READY.value, S.READY.value,
                           "takes traffic from now on", url=inst.handle.url, cold_start_s=now - inst.created)
        if self.metrics is not None:
            self.metrics.cold_start.labels(self.model, self.version).observe(now - inst.created)

    def _leave_pool(self, inst: ManagedInstance, reason: str) -> None:
        if not inst.in_pool:
            return
        seen = self.pool.get(inst.id)
        in_flight = seen.inflight if seen is not None else 0
        if seen is not None:
            self.pool.remove_instance(inst.id)
        inst.in_pool = False
        self.history.event(self.wall(), inst.id, "pool_remove", inst.state.value, inst.state.value, reason,
                           in_flight=in_flight, served=seen.served if seen is not None else 0)

    def _transition(self, inst: ManagedInstance, new: InstanceState, reason: str, **details: Any) -> None:
        old = inst.state
        check_transition(old, new)
        inst.state, inst.since, inst.reason = new, self.clock(), reason
        self.history.event(self.wall(), inst.id, "transition", old.value, new.value, reason, **details)
        log.info("%s: %s %s -> %s (%s)", self.key, inst.id, old.value, new.value, reason)
        if self.metrics is not None:
            self.metrics.transitions.labels(self.model, self.version, old.value, new.value).inc()
        if not new.billed:
            self.instances.pop(inst.id, None)
            self.finished.append(inst)

    def _served(self, inst: ManagedInstance) -> int:
        seen = self.pool.get(inst.id)
        return seen.served if seen is not None else 0

    def _bill(self, now: float) -> None:
        if self._last_billing is not None and self.metrics is not None:
            billed = sum(1 for i in self.instances.values() if i.state.billed)
            self.metrics.instance_seconds.labels(self.model, self.version).inc(billed * (now - self._last_billing))
        if self._last_billing is not None:
            self._bill_classes(now - self._last_billing)
        self._last_billing = now

