"""A provider whose every start and stop carries the pool lease's fencing token.

Wraps any :class:`~llmserve.autoscale.providers.base.InstanceProvider` (local
processes, Ray actors, foreign servers started from a command). Before it acts
it asks the store whether the token it carries is still the lease's
(:meth:`llmserve.state.lease.Lease.valid`); a stale one is refused with
:class:`StaleLeader`. The check sits here, in the provider path, not in the
leader's loop: a leader paused (SIGSTOP, a long GC, a VM migration) past its
lease that wakes up in the middle of a step still cannot start or stop anything.

A start is checked again once the instance exists: a leader that lost the lease
while the instance was starting stops what it just made, so a late start
leaves nothing behind. The token is written into the spec, hence into the
provider's listing, so the next leader sees who started each instance.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Protocol

from llmserve.autoscale.providers.base import InstanceHandle, InstanceProvider, InstanceSpec, RunStatus

log = logging.getLogger(__name__)


class StaleLeader(RuntimeError):
    """This replica's fencing token is no longer the pool lease's: the action is refused."""


class Fence(Protocol):
    token: int | None

    async def valid(self, token: int) -> bool: ...


class FencedProvider:
    """``inner``'s starts and stops, each checked against ``fence`` for pool ``pool``."""

    def __init__(self, inner: InstanceProvider, fence: Fence, pool: str) -> None:
        self.inner = inner
        self.fence = fence
        self.pool = pool
        self.name = inner.name
        self.refused = 0  # actions refused for a stale token (tests, metrics)
        if hasattr(inner, "reclaim"):  # a simulated reclaim kills an instance: fenced too
            self.reclaim = self._reclaim

    async def _check(self, what: str) -> int:
        token = self.fence.token
        if token is None or not await self.fence.valid(token):
            self.refused += 1
            log.warning("pool %s: %s refused: token %s no longer holds the lease", self.pool, what, token)
            raise StaleLeader(f"{what} refused: fencing token {token} no longer holds the lease of {self.pool}")
        return token

    async def start(self, spec: InstanceSpec) -> InstanceHandle:
        token = await self._check(f"start of {spec.instance_id}")
        handle = await self.inner.start(dataclasses.replace(spec, pool=self.pool, token=token))
        if not await self.fence.valid(token):
            self.refused += 1
            log.warning("pool %s: lease lost while %s started; stopping it", self.pool, spec.instance_id)
            await self.inner.stop(handle, 0.0)
            raise StaleLeader(f"start of {spec.instance_id} undone: the lease of {self.pool} was lost meanwhile")
        return handle

    async def stop(self, handle: InstanceHandle, grace_s: float) -> int | None:
        await self._check(f"stop of {handle.instance_id}")
        return await self.inner.stop(handle, grace_s)

    async def _reclaim(self, handle: InstanceHandle, notice_s: float) -> float | None:
        await self._check(f"reclaim of {handle.instance_id}")
        return await self.inner.reclaim(handle, notice_s)

    async def status(self, handle: InstanceHandle) -> RunStatus:
        return await self.inner.status(handle)

    async def log_tail(self, handle: InstanceHandle, lines: int = 20) -> str:
        return await self.inner.log_tail(handle, lines)

    async def listing(self) -> list[InstanceHandle]:
        """The pool's instances as the provider lists them (any leader's)."""
        listing = getattr(self.inner, "listing", None)
        return [] if listing is None else await listing(self.pool)

    async def adopt(self, handle: InstanceHandle) -> bool:
        """Take over a listed instance under our token (checked: a stale leader adopts nothing)."""
        token = await self._check(f"adoption of {handle.instance_id}")
        return await self.inner.adopt(handle, token)

    def detach(self, instance_ids: list[str]) -> None:
        """Forget these instances, running: another replica leads the pool now."""
        detach = getattr(self.inner, "detach", None)
        if detach is not None:
            detach(instance_ids)

    async def close(self) -> None:
        await self.inner.close()
