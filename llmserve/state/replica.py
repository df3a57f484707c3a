"""One gateway replica's view of the shared documents: polled, adopted, changed by
compare-and-set, frozen while the store is away.

Each :class:`Document` (a model's rollout, a model's admin overrides) knows how to
turn what this replica holds into JSON (``snapshot``) and how to take a stored
version in (``adopt``). :class:`Replica` polls the store every ``sync_interval_s``
and adopts every document whose version moved; :meth:`Replica.change` applies a
change locally and writes it against the version it started from: when another
replica wrote first, the winner's document is adopted and the change is tried
again on top of it; when the store does not answer, the change is taken back
(``restore``) and :class:`Frozen` raised: nothing a replica decides counts until the
store holds it.

While the store is away every replica keeps serving on the documents it last
adopted; ``details()`` (for ``/ready``) and ``gauges()`` (for ``/metrics``) say so.
The first successful poll ends the freeze; a store that came back empty gets each
document from the first replica to notice (its last known state).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from contextlib import suppress
from typing import Any, Protocol, TypeVar

from llmserve.gateway.metrics import gauge
from llmserve.state.store import SharedState, StoreUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")


class Frozen(RuntimeError):
    """The shared store is unreachable: no shared document may change until it returns."""


class Document(Protocol):
    """A piece of state every replica must agree on. ``role``: ``peer`` (any replica
    may change it), ``writer`` (this replica alone publishes it: its snapshot goes to
    the store whenever it differs) or ``reader`` (adopted, never written)."""

    key: str
    role: str

    def snapshot(self) -> dict[str, Any]:
        """What this replica holds, as a JSON object."""

    def adopt(self, value: dict[str, Any]) -> None:
        """Take a stored version in; ValueError (nothing changed) if it is malformed."""

    def checkpoint(self) -> Any:
        """Enough to put this replica back as it is now (``restore``)."""

    def restore(self, checkpoint: Any) -> None: ...

    def settle(self) -> None:
        """Make the live system follow the document (weights, pools) after any change."""


class Replica:
    def __init__(self, store: SharedState, *, sync_interval_s: float = 0.5,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.sync_interval_s = sync_interval_s
        self._clock = clock
        self._docs: dict[str, Document] = {}
        self._seen: dict[str, int] = {}  # key -> version last adopted or written
        self.down_since: float | None = None
        self.last_error = ""
        self._task: asyncio.Task | None = None
        # One reader-writer at a time: a poll must not adopt an older version over a write.
        self._lock = asyncio.Lock()

    @property
    def frozen(self) -> bool:
        return self.down_since is not None

    def add(self, docs: Iterable[Document]) -> None:
        self._docs.update((d.key, d) for d in docs)

    async def start(self) -> None:
        await self.sync()
        self._task = asyncio.create_task(self._loop(), name="shared-state-sync")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
        await self.store.close()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.sync_interval_s)
            try:
                await self.sync()
            except Exception:  # one bad document must not end every replica's sync
                log.exception("shared state sync failed")

    async def sync(self) -> None:
        """Adopt every document that moved; publish ours where the store has none."""
        try:
            async with self._lock:
                for doc in self._docs.values():
                    await self._sync_one(doc)
        except StoreUnavailable as e:
            self._down(str(e))
            return
        if self.down_since is not None:
            log.warning("shared store is back after %.1f s: shared state live again",
                        self._clock() - self.down_since)
        self.down_since, self.last_error = None, ""

    async def refresh(self, doc: Document) -> None:
        """Adopt the latest version before showing it (the last known one while down)."""
        if not self.frozen:
            with suppress(StoreUnavailable):
                async with self._lock:
                    await self._sync_one(doc)

    async def change(self, doc: Document, mutate: Callable[[], T], *, tries: int = 3) -> T:
        """``mutate()`` on the latest version, written by compare-and-set. Raises
        Frozen (with the change taken back) when the store is away; whatever
        ``mutate`` raises leaves the document unchanged."""
        if self.frozen:
            raise Frozen(f"shared state is frozen: {self.last_error}")
        async with self._lock:
            for _ in range(tries):
                try:
                    await self._sync_one(doc)
                except StoreUnavailable as e:
                    self._down(str(e))
                    raise Frozen(f"shared state is frozen: {e}") from None
                cp, before = doc.checkpoint(), doc.snapshot()
                result = mutate()
                after = doc.snapshot()
                if after == before:
                    return result
                if await self._write(doc, after, cp):
                    return result
            raise Frozen("the shared state kept changing under this change; try again")

    async def _write(self, doc: Document, value: dict[str, Any], cp: Any) -> bool:
        try:
            done = await self.store.write(doc.key, value, self._seen.get(doc.key, 0))
            if done is not None:
                self._seen[doc.key] = done.version
                doc.settle()
                return True
            self._seen.pop(doc.key, None)  # lost the race: adopt the winner's version
            await self._sync_one(doc)
            return False
        except StoreUnavailable as e:
            self._down(str(e))
            doc.restore(cp)
            doc.settle()
            raise Frozen(f"shared state is frozen: {e}") from None

    async def _sync_one(self, doc: Document) -> None:
        got = await self.store.read(doc.key)
        if doc.role == "writer":
            mine = doc.snapshot()
            if got is None or got.value != mine:
                done = await self.store.write(doc.key, mine, 0 if got is None else got.version)
                if done is not None:
                    self._seen[doc.key] = done.version
            return
        if got is None and doc.role == "reader":
            return  # the writer has not published yet
        if got is None:  # first replica up, or the store came back empty
            done = await self.store.write(doc.key, doc.snapshot(), 0)
            if done is not None:
                self._seen[doc.key] = done.version
                return
            got = await self.store.read(doc.key)  # another replica published first
            if got is None:
                return
        if self._seen.get(doc.key) != got.version:
            self._seen[doc.key] = got.version  # a bad one is logged once, replaced by our next write
            try:
                doc.adopt(got.value)
            except ValueError as e:  # never half applied; keep serving as we were
                log.error("ignoring shared document %s version %d: %s", doc.key, got.version, e)
                return
            doc.settle()

    def _down(self, error: str) -> None:
        if self.down_since is None:
            log.warning("%s: shared state frozen, serving on the last known state", error)
            self.down_since = self._clock()
        self.last_error = error

    def details(self) -> dict[str, Any]:
        state: dict[str, Any] = {"store": "unreachable" if self.frozen else "ok",
                                 "rollouts": "frozen" if self.frozen else "live"}
        if self.frozen:
            state.update(since=self.down_since, error=self.last_error)
        return {"shared_state": state}

    def gauges(self) -> list:
        up = gauge("shared_state_up", "1 while the shared store answers, 0 while shared state is frozen", [])
        up.add_metric([], 0.0 if self.frozen else 1.0)
        seen = gauge("shared_document_version", "Version of each shared document this replica holds",
                     ["key"])
        for key, version in self._seen.items():
            seen.add_metric([key], float(version))
        return [up, seen]
