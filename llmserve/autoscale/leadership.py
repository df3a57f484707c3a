"""A pool's controller among replicas: it scales only while it holds the pool's lease.

Every gateway replica runs a :class:`LeaderController` for each pool; the one
holding the pool's lease (:mod:`llmserve.state.lease`) is its leader and runs
the ordinary controller step (observe, tick, effects through the executor), with
a provider that refuses any action whose fencing token is stale
(:mod:`llmserve.autoscale.providers.fenced`). After each step it publishes the
pool's view (which instances serve, at which URL, draining or not) with a write
only the holder can make. The others are followers: they serve traffic from that
view (the gateway's own polls still judge each instance's ``/ready``) and take
no decision.

Takeover (the lease was free: the old leader died, paused or left): the new
leader adopts what the provider lists for the pool (a local process registry on
disk, Ray actors by name): an instance that answers ``/ready`` is ready at once,
one that does not yet is ``starting`` and the probes take it from there; so
nothing is started twice. Its ids carry the new token, never reusing an old
leader's. The first tick is due at once, so scaling resumes within the TTL plus
one tick. Orphans (listed, yet in no leader's book: a start the old leader
made as it lost the lease) are stopped by a sweep after a tick, once a TTL.

Step-down (the lease was lost): the book is forgotten, not stopped: the
instances belong to the pool, and the new leader adopts them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import suppress
from typing import Any

from llmserve.autoscale.controller import PoolController
from llmserve.autoscale.managed import ManagedInstance
from llmserve.autoscale.override_share import OverrideShare, SharedOverride
from llmserve.autoscale.providers.base import InstanceHandle
from llmserve.autoscale.providers.fenced import FencedProvider, StaleLeader
from llmserve.lifecycle import InstanceState
from llmserve.state.lease import STORE_ERRORS, Lease
from llmserve.state.signals import SignalForwarder, SignalIntake

log = logging.getLogger(__name__)
S = InstanceState
SERVING = (S.READY, S.DRAINING)


def view_key(pool: str) -> str:
    return f"llmserve:view:{pool}"


def signals_key(pool: str) -> str:
    return f"llmserve:signals:{pool}"


class _OwnSignals:
    """The leader's collector as a replay target: the controller's own ``on_*``, not forwarded."""

    def __init__(self, controller: PoolController) -> None:
        self.c = controller

    def on_arrival(self, *a) -> None:
        PoolController.on_arrival(self.c, *a)

    def on_first_token(self, *a) -> None:
        PoolController.on_first_token(self.c, *a)

    def on_finish(self, *a) -> None:
        PoolController.on_finish(self.c, *a)

    def on_batch_need(self, *a) -> None:
        PoolController.on_batch_need(self.c, *a)


class LeaderController(PoolController):
    """A :class:`PoolController` that acts only while it holds ``lease``; ``provider``
    must be a :class:`FencedProvider` over that same lease."""

    def __init__(self, *args: Any, lease: Lease, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        assert isinstance(self.provider, FencedProvider)
        self.lease = lease
        self.leading = False
        self.takeovers = 0  # times this replica took the lease
        self.took_over_wall: float | None = None
        self.resumed_wall: float | None = None  # the first tick after the takeover: scaling resumed
        self.steps_to_resume: int | None = None  # steps between taking the lease and that tick
        self._steps_led = 0
        self._base_prefix = self._prefix
        self._last_hold: float | None = None
        self._last_sweep: float | None = None
        self._store_error: str | None = None
        self.overrides = OverrideShare(lease.redis, self.key)
        # Followers forward what their requests show; the leader replays it into its own
        # collector (state/signals.py), so it scales on all the replicas' traffic.
        self._forward = SignalForwarder(lease.redis, key=signals_key(self.key))
        self._intake = SignalIntake(lease.redis, lambda: [_OwnSignals(self)], key=signals_key(self.key))

    # ---- the step ----------------------------------------------------------------------------
    async def step(self) -> None:
        now = self.clock()
        if self._last_hold is None or not self.leading or now - self._last_hold >= self.lease.config.renew_every_s:
            held = await self.lease.hold()
            self._last_hold, self._store_error = now, held.error
            await self.lease.present()
            if held.token is not None and (held.new or not self.leading):
                self._step_down("the lease was taken again, with a new token")  # start from the listing
                await self._take_over()
            elif held.token is None and self.leading:
                self._step_down("the lease is held by another replica or expired")
        elif not self.lease.leading():
            self._step_down("the lease expired before it could be renewed")
        await self._adopt_override()
        if not self.leading:
            await self._forward.step()
            await self._follow()
            return
        await self._intake.step()
        ticked = self._next_tick is None or now >= self._next_tick
        await super().step()
        if ticked and self.resumed_wall is None:
            self.resumed_wall, self.steps_to_resume = self.wall(), self._steps_led
        self._steps_led += 1
        if ticked and (self._last_sweep is None or now - self._last_sweep >= self.lease.config.ttl_s):
            self._last_sweep = now  # a listing can be costly (Ray: a call per actor): once a TTL
            await self._sweep()
        await self._publish()

    async def _take_over(self) -> None:
        token = self.lease.token
        self.leading, self.takeovers, self.took_over_wall = True, self.takeovers + 1, self.wall()
        self.resumed_wall, self.steps_to_resume, self._steps_led = None, None, 0
        self._prefix, self._next_id = f"{self._base_prefix}t{token}-", 1
        self._next_tick = None  # tick at once: scaling resumes now, not a tick later
        self._last_sweep = None
        listed = []
        for handle in await self.provider.listing():
            try:
                if await self.provider.adopt(handle):
                    listed.append(handle)
            except StaleLeader:
                self._step_down("the lease was lost during the takeover")
                return
        adopted = await asyncio.gather(*(self._adopt(h) for h in listed))
        log.info("%s: leader with token %d; adopted %d instance(s): %s", self.key, token, len(adopted),
                 ", ".join(adopted) or "none")
        for inst in list(self.pool.instances()):  # a follower's view the listing no longer has
            if inst.instance_id not in self.instances:
                self.pool.remove_instance(inst.instance_id)

    async def _adopt(self, handle: InstanceHandle) -> str:
        """One listed instance into the book: ready when ``/ready`` says so, else starting."""
        run = await self.provider.status(handle)
        probe = await self._prober.ready(handle, run)
        now, wall = self.clock(), self.wall()
        ready = probe.http_status == 200 and probe.engine_state in (None, S.READY)
        rec = ManagedInstance(handle.instance_id, S.READY if ready else S.STARTING, now, wall, now,
                              f"adopted from the {self.provider.name} provider's listing", handle=handle)
        self.book.add(rec, rec.reason, token=self.lease.token, url=handle.url)
        if ready:
            rec.ready_at, rec.probed_at, rec.last_probe = now, now, probe
            if self.pool.get(rec.id) is not None:  # already serving from the follower's view
                rec.in_pool = True
                self.pool.set_draining(rec.id, False)
            else:
                self.router.join(rec)
        return rec.id

    def _step_down(self, why: str) -> None:
        if not self.leading:
            return
        log.warning("%s: no longer the leader (%s); %d instance(s) left to the next one", self.key, why,
                    len(self.instances))
        self.leading = False
        for task in self.launcher.tasks.values():
            task.cancel()
        self.launcher.tasks.clear()
        ids = list(self.instances)
        self.book.instances.clear()
        self.executor.replacements.clear()
        self.provider.detach(ids)

    async def _sweep(self) -> None:
        """Stop listed instances that no book holds (a stale leader's late start)."""
        for handle in await self.provider.listing():
            if handle.instance_id in self.instances or self.book.find(handle.instance_id) is not None:
                continue
            if handle.ref.get("token") == self.lease.token:
                continue  # ours, on its way into the book
            log.warning("%s: stopping orphan %s (token %s)", self.key, handle.instance_id, handle.ref.get("token"))
            try:
                if await self.provider.adopt(handle):
                    await self.provider.stop(handle, self.config.stop_grace_s)
            except StaleLeader:
                return

    # ---- request signals: the leader's own, and the followers' forwarded -------------------------
    def _mine(self, model: str, version: str | None = None) -> bool:
        return not self.leading and model == self.model and version in (None, self.version)

    def on_arrival(self, model: str, version: str, t: float, prompt_chars: int, batch: bool = False) -> None:
        if self._mine(model, version):
            self._forward.on_arrival(model, version, t, prompt_chars, batch)
        super().on_arrival(model, version, t, prompt_chars, batch)

    def on_first_token(self, model: str, version: str, t: float, ttft_s: float, batch: bool = False) -> None:
        if self._mine(model, version):
            self._forward.on_first_token(model, version, t, ttft_s, batch)
        super().on_first_token(model, version, t, ttft_s, batch)

    def on_finish(self, model: str, version: str, t: float, e2e_s: float, output_tokens: int,
                  ok: bool, batch: bool = False) -> None:
        if self._mine(model, version):
            self._forward.on_finish(model, version, t, e2e_s, output_tokens, ok, batch)
        super().on_finish(model, version, t, e2e_s, output_tokens, ok, batch)

    def on_batch_need(self, model: str, lines_per_s: float) -> None:
        if self._mine(model):
            self._forward.on_batch_need(model, lines_per_s)
        super().on_batch_need(model, lines_per_s)

    # ---- the manual override, on any replica's admin API ---------------------------------------
    def set_override(self, instances: int | None, duration_s: float | None, reason: str):
        o = super().set_override(instances, duration_s, reason)  # checked here: a bad one is a 400 at once
        self.overrides.set_here(SharedOverride.new(instances, duration_s, reason, self.wall()))
        return o

    async def _adopt_override(self) -> None:
        o = await self.overrides.sync()
        if o is None:
            return
        remaining = o.remaining_s(self.wall())
        if remaining is not None and remaining <= 0:
            return  # ended already
        try:
            super().set_override(o.instances, remaining, f"{o.reason} (set on another replica)")
        except ValueError as e:
            log.warning("%s: cannot apply the shared override: %s", self.key, e)

    # ---- what followers see --------------------------------------------------------------------
    async def _publish(self) -> None:
        view = {"token": self.lease.token, "holder": self.lease.holder, "at": self.wall(),
                "instances": [{"id": i.id, "url": i.handle.url, "state": i.state.value}
                              for i in self.book if i.handle is not None and i.state in SERVING and i.in_pool]}
        await self.lease.fenced_set(view_key(self.key), json.dumps(view))

    async def _follow(self) -> None:
        """The pool as the leader last published it; the last one seen when the store is gone."""
        try:
            raw = await self.lease.redis.get(view_key(self.key))
        except STORE_ERRORS:
            return
        if not raw:
            return
        try:
            published = {i["id"]: i for i in json.loads(raw)["instances"]}
        except (ValueError, KeyError, TypeError):
            log.warning("%s: unreadable pool view in the store; keeping the last one", self.key)
            return
        for inst in list(self.pool.instances()):
            if inst.instance_id not in published:
                self.pool.remove_instance(inst.instance_id)
        for iid, i in published.items():
            if self.pool.get(iid) is None:
                try:
                    self.pool.add_instance(i["url"], iid, ready=True)
                except ValueError:
                    continue  # its URL is another id's still: the next view sorts it out
            self.pool.set_draining(iid, i["state"] == S.DRAINING.value)

    # ---- shutdown --------------------------------------------------------------------------------
    async def stop(self) -> None:
        """Hand the pool to the other replicas when any is alive; the last one out stops it."""
        if self._loop_task is not None:  # no step may run while we decide
            self._loop_task.cancel()
            with suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
        await self.lease.absent()  # first: two replicas leaving together must not count each other
        others = await self.lease.others_alive()
        if others > 0 and self.leading:
            log.info("%s: leaving the pool's %d instance(s) to %d other replica(s)", self.key,
                     len(self.instances), others)
            self._step_down("shutting down")
            await self.lease.release()  # the next leader takes over now, not a TTL later
        elif others == 0 and not self.leading:
            await self._take_last()
        await super().stop()
        await self.lease.release()

    async def _take_last(self) -> None:
        """The last replica out: take the pool (waiting out a leader that is leaving too,
        or a dead one's lease) to stop what runs."""
        deadline = self.clock() + self.lease.config.ttl_s + 1.0
        while self.clock() < deadline:
            held = await self.lease.hold()
            if held.token is not None:
                await self._take_over()
                return
            if held.error is not None:
                return  # no store: nothing can be proven ours to stop
            await asyncio.sleep(self.lease.config.renew_every_s / 2)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "lease": {
            "role": "leader" if self.leading else "follower", "holder": self.lease.holder,
            "token": self.lease.token if self.leading else None, "takeovers": self.takeovers,
            "refused": self.provider.refused, "store_error": self._store_error,
            "took_over_at": self.took_over_wall, "resumed_at": self.resumed_wall,
            "steps_to_resume": self.steps_to_resume,
            "serving": len(self.pool.instances())}}
