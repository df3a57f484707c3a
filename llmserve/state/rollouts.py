"""Who holds a model's rollout: this process alone, or every replica through the store.

The gateway drives its canaries through one of two :class:`Rollouts`:

- :class:`LocalRollouts` (no ``state.redis_url``): the analysis lives in this
  process, exactly as a single gateway has always kept it;
- :class:`SharedRollouts`: the rollout is a versioned JSON document in the shared
  store (``rollout_doc.py``). Every replica polls it and adopts what changed, so the
  weights, the stage and the history are the same on every replica; a look or an
  admin action is applied locally and then written with compare-and-set against the
  version it started from, so when two replicas act at once exactly one wins and
  the other adopts the winner's document. Which replicas may look at all is
  ``may_decide`` (every replica by default; the leader alone with a lease).

Degrade, never fail: when the store does not answer, every replica keeps routing on
the last document it adopted, takes no look and refuses admin actions (503): no
promote and no roll back without the store. ``/ready`` and the metrics say so, and
the first successful poll resumes the rollout where the store has it (or, if the
store came back empty, from this replica's last known state).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from contextlib import suppress
from typing import Any, Protocol

from llmserve.gateway.canary import Action, CanaryAnalysis
from llmserve.gateway.metrics import gauge
from llmserve.state.rollout_doc import adopt, rollout_doc
from llmserve.state.store import SharedState, StoreUnavailable

log = logging.getLogger(__name__)


class RolloutsFrozen(RuntimeError):
    """The shared store is unreachable: no rollout may change until it returns."""


class Rollout(Protocol):
    """What a rollout driver needs of a model's runtime (``gateway/runtime.py``)."""

    name: str
    canary: CanaryAnalysis | None

    def tick(self, now: float) -> Action: ...

    def canary_action(self, action: str, reason: str) -> None: ...

    def apply_weights(self) -> None: ...


class Rollouts(Protocol):
    async def start(self, models: Iterable[Rollout]) -> None: ...

    async def stop(self) -> None: ...

    async def tick(self, rt: Rollout, now: float) -> None: ...

    async def refresh(self, rt: Rollout) -> None:
        """Bring ``rt`` up to date before it is shown."""

    async def act(self, rt: Rollout, action: str, reason: str) -> None:
        """Apply an admin action; raises InvalidTransition or RolloutsFrozen."""

    def details(self) -> dict[str, Any]: ...

    def gauges(self) -> list: ...


class LocalRollouts:
    """One process: the analysis is the truth."""

    async def start(self, models: Iterable[Rollout]) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def tick(self, rt: Rollout, now: float) -> None:
        rt.tick(now)

    async def refresh(self, rt: Rollout) -> None:
        return None

    async def act(self, rt: Rollout, action: str, reason: str) -> None:
        rt.canary_action(action, reason)

    def details(self) -> dict[str, Any]:
        return {}

    def gauges(self) -> list:
        return []


def rollout_key(model: str) -> str:
    return f"rollout:{model}"


class SharedRollouts:
    """Rollouts as versioned documents in ``store``, polled every ``sync_interval_s``."""

    def __init__(self, store: SharedState, *, sync_interval_s: float = 0.5,
                 may_decide: Callable[[], bool] = lambda: True,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.sync_interval_s = sync_interval_s
        self.may_decide = may_decide
        self._clock = clock
        self._models: dict[str, Rollout] = {}
        self._seen: dict[str, int] = {}  # model -> version of the document last adopted or written
        self.down_since: float | None = None
        self.last_error = ""
        self._task: asyncio.Task | None = None
        # One reader-writer at a time: a poll must not adopt an older version over a write.
        self._lock = asyncio.Lock()

    @property
    def frozen(self) -> bool:
        return self.down_since is not None

    async def start(self, models: Iterable[Rollout]) -> None:
        self._models = {rt.name: rt for rt in models if rt.canary is not None}
        await self.sync()
        self._task = asyncio.create_task(self._loop(), name="rollout-sync")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
        await self.store.close()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.sync_interval_s)
            await self.sync()

    async def sync(self) -> None:
        """Adopt every document that changed; publish ours where the store has none."""
        try:
            async with self._lock:
                for rt in self._models.values():
                    await self._sync_one(rt)
        except StoreUnavailable as e:
            self._down(str(e))
            return
        if self.down_since is not None:
            log.warning("shared store is back after %.1f s: rollouts resume",
                        self._clock() - self.down_since)
        self.down_since, self.last_error = None, ""

    async def _sync_one(self, rt: Rollout) -> None:
        key = rollout_key(rt.name)
        doc = await self.store.read(key)
        if doc is None:  # first replica up, or the store came back empty
            if await self.store.write(key, rollout_doc(rt.canary), 0) is not None:
                self._seen[rt.name] = 1
                return
            doc = await self.store.read(key)  # another replica published first
            if doc is None:
                return
        if self._seen.get(rt.name) != doc.version:
            try:
                adopt(rt.canary, doc.value)
            except ValueError as e:  # never half applied; keep routing as we were
                log.error("ignoring the shared rollout of %s: %s", rt.name, e)
                return
            self._seen[rt.name] = doc.version
            rt.apply_weights()

    def _down(self, error: str) -> None:
        if self.down_since is None:
            log.warning("%s: rollouts frozen, serving on the last known weights", error)
            self.down_since = self._clock()
        self.last_error = error

    async def tick(self, rt: Rollout, now: float) -> None:
        if rt.name not in self._models or self.frozen or not self.may_decide():
            return  # evidence keeps accumulating; the look waits for the store
        async with self._lock:
            before = rollout_doc(rt.canary), rt.canary.evidence
            if rt.tick(now) is not Action.NONE:
                await self._publish(rt, before)

    async def refresh(self, rt: Rollout) -> None:
        """Adopt the latest document before showing it (the last known one while down)."""
        if rt.name in self._models and not self.frozen:
            with suppress(StoreUnavailable):
                async with self._lock:
                    await self._sync_one(rt)

    async def act(self, rt: Rollout, action: str, reason: str) -> None:
        if self.frozen:
            raise RolloutsFrozen(f"rollouts are frozen: {self.last_error}")
        async with self._lock:
            await self._act(rt, action, reason)

    async def _act(self, rt: Rollout, action: str, reason: str) -> None:
        for _ in range(3):  # lost a race: adopt the winner's document and try again
            try:
                await self._sync_one(rt)
            except StoreUnavailable as e:
                self._down(str(e))
                raise RolloutsFrozen(f"rollouts are frozen: {e}") from None
            before = rollout_doc(rt.canary), rt.canary.evidence
            rt.canary_action(action, reason)  # InvalidTransition: nothing changed
            if await self._publish(rt, before):
                return
            if self.frozen:
                raise RolloutsFrozen(f"rollouts are frozen: {self.last_error}")
        raise RolloutsFrozen("the rollout kept changing under this action; try again")

    async def _publish(self, rt: Rollout, before: tuple[dict, Any]) -> bool:
        """Write what ``rt`` now holds over the version it started from. Lost race:
        adopt the winner. Store down: put back ``before`` (nothing changes without
        the store). True when written."""
        key = rollout_key(rt.name)
        try:
            done = await self.store.write(key, rollout_doc(rt.canary), self._seen.get(rt.name, 0))
            if done is not None:
                self._seen[rt.name] = done.version
                return True
            self._seen.pop(rt.name, None)
            await self._sync_one(rt)
        except StoreUnavailable as e:
            self._down(str(e))
            adopt(rt.canary, before[0])
            rt.canary.evidence = before[1]  # the step's outcomes, kept for the next look
        rt.apply_weights()
        return False

    def details(self) -> dict[str, Any]:
        state = {"store": "unreachable" if self.frozen else "ok",
                 "rollouts": "frozen" if self.frozen else "live"}
        if self.frozen:
            state.update(since=self.down_since, error=self.last_error)
        return {"shared_state": state}

    def gauges(self) -> list:
        up = gauge("shared_state_up", "1 while the shared store answers, 0 while rollouts are frozen", [])
        up.add_metric([], 0.0 if self.frozen else 1.0)
        seen = gauge("rollout_version", "Version of each model's shared rollout document this replica holds",
                     ["model"])
        for model, version in self._seen.items():
            seen.add_metric([model], float(version))
        return [up, seen]


async def open_rollouts(redis_url: str | None, password_file: Any = None, *,
                        sync_interval_s: float = 0.5) -> Rollouts:
    """LocalRollouts without a URL; else SharedRollouts on an authenticated client
    (a StoreError, one line, when the store refuses us or cannot be reached)."""
    if redis_url is None:
        return LocalRollouts()
    from llmserve.state.redis_conn import connect
    from llmserve.state.store import RedisStore

    return SharedRollouts(RedisStore(await connect(redis_url, password_file)),
                          sync_interval_s=sync_interval_s)


def check_store(redis_url: str | None, password_file: Any = None) -> None:
    """Before a replica starts serving: exit with one line if the store refuses us."""
    if redis_url is None:
        return
    from llmserve.state.redis_conn import StoreError, connect

    async def once() -> None:
        await (await connect(redis_url, password_file)).aclose()

    try:
        asyncio.run(once())
    except StoreError as e:
        raise SystemExit(f"llmserve: error: {e}") from None
