"""Runs batch lines through the gateway's own request path, at the batch priority class.

Each pending line is sent in process (``asgi_call``) to the gateway app, so it is
validated, routed, admitted and balanced as a client's request would be; its
privileges are the batch class only, so realtime traffic keeps going first.
``concurrency`` lines per ready instance are in flight (with ``share``, as many as
the controllers' forecast leaves room for: ``share.py``; more only when a
completion window needs them: ``pace.py``); the rest of the backlog waits in the store, not in the
admission queues. A 429 / 499 / 502 / 503 / 504 (the pool is full or has no
instance yet) is tried again after ``retry_interval_s``; any other answer is the
line's one result, and so is a 429 for the submitting key's spent budget: a line is
charged to that key's budget and usage (``budget_keys``), not to its rate windows
and concurrency, which are for its interactive traffic.

Each tick the request observers (the autoscaler) are told, per model, the lines
per second the active batches' windows require while idle seats do not deliver
it (``pace.told_need``): a pool grows for a batch only as far as that rate needs,
never for the backlog itself.

One runner owns a state folder at a time (an exclusive lock file): two gateways
pointed at one folder do not both run its lines. A batch ends when no line is
pending or in flight: ``completed``; or at once after a cancel (``cancelled``) or past
its window (``expired``), its lines in flight abandoned and, with those not run,
failed in the error file (``store.finalize``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp

from llmserve.api.asgi_call import call
from llmserve.api.frontends import OWNER_KEY
from llmserve.gateway.auth import Privileges
from llmserve.gateway.batches.config import BatchConfig
from llmserve.gateway.batches.pace import PaceMeter, lines_in_flight, told_need
from llmserve.gateway.batches.share import base_lines, batch_room
from llmserve.gateway.events import RequestObserver
from llmserve.gateway.batches.store import BatchStore, line_result
from llmserve.priority import PriorityClass

log = logging.getLogger(__name__)

PRIVILEGES_KEY = "llmserve.privileges"  # a scope key: set in process only, never by a client
BATCH_ONLY = Privileges.build(PriorityClass.BATCH, [PriorityClass.BATCH])
_RETRY = frozenset({429, 499, 502, 503, 504})
PACE_WINDOW_S = 60.0  # a batch's pace is measured over this much recent time


class BatchRunner:
    """A gateway service (start / stop) that works through every active batch."""

    def __init__(self, store: BatchStore, config: BatchConfig, lock_path: Path) -> None:
        self.store, self.config, self.lock_path = store, config, lock_path
        self.app: ASGIApp | None = None  # the gateway app, set once it exists
        self.in_flight: dict[tuple[str, int], asyncio.Task] = {}
        self.wake = asyncio.Event()
        self._seen: dict[str, PaceMeter] = {}  # each active batch's pace
        self.observers: list[RequestObserver] = []  # told each model's batch need
        self.ready_instances: Callable[[], int] = lambda: 1  # the gateway's ready instances, set with it
        self.batch_room: Callable[[], int] = lambda: batch_room(())  # a ready instance's (share.py), likewise
        self._models: dict[str, str] = {}  # batch id -> the model its lines name
        self._told: set[str] = set()  # models last told a need (told 0 once they have none)
        self._task: asyncio.Task | None = None
        self._lock_file: Any = None
        self.budget_keys: dict[str, str] = {}  # a batch's owner -> its key's name (whose budget lines charge)
        self._served: dict[str, int] = {}  # key digest or batch id -> the turn it last got a seat (_share)
        self._turn = 0

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="batch-runner")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self.in_flight.values()) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        if self._lock_file is not None:
            self._lock_file.close()  # releases the lock
            self._lock_file = None

    def _own_folder(self) -> bool:
        if self._lock_file is None:
            f = open(self.lock_path, "a+")  # noqa: SIM115 - held open for as long as the lock
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                return False
            self._lock_file = f
        return True

    async def _run(self) -> None:
        warned = False
        while True:
            try:
                if await asyncio.to_thread(self._own_folder):
                    await self.tick()
                elif not warned:
                    log.warning("another gateway runs the batches in %s", self.lock_path.parent)
                    warned = True
            except Exception:  # noqa: BLE001 - the runner must outlive one bad tick
                log.exception("batch runner tick failed")
            self.wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.config.poll_interval_s)

    def _allowed(self, batches: list[dict[str, Any]], now: float) -> int:
        """Lines in flight for all batches: the base, or what the most pressed window needs (pace.py);
        and each model's need told to the observers."""
        cfg = self.config
        base = base_lines(cfg.share, cfg.concurrency, cfg.max_concurrency, self.realtime_load(),
                          self.ready_instances(), self.batch_room())
        allowed = base
        need: dict[str, float] = {}
        for b in batches:
            c = b["request_counts"]
            remaining = c["total"] - c["completed"] - c["failed"]
            rate = self._seen.setdefault(b["id"], PaceMeter(PACE_WINDOW_S)).rate(now, c["completed"] + c["failed"])
            allowed = max(allowed, lines_in_flight(base, cfg.max_concurrency, remaining, rate, b["expires_at"] - now))
            model = self._models.get(b["id"])
            if model is not None:
                need[model] = need.get(model, 0.0) + told_need(remaining, b["expires_at"] - now, rate)
        for model in self._told | need.keys():
            for o in self.observers:
                o.on_batch_need(model, need.get(model, 0.0))
        self._told = set(need)
        return allowed

    def realtime_load(self) -> float | None:
        """The realtime load the observers' predictive policies forecast, in instances, summed
        over their pools (as ``ready_instances`` counts every pool's); None: no forecast."""
        loads = [x for x in (getattr(o, "realtime_load", None) for o in self.observers) if isinstance(x, float)]
        return sum(loads) if loads else None

    async def tick(self) -> None:
        """Start lines up to the allowed number, shared out over the batches (``_share``); end
        batches with nothing left."""
        batches = await asyncio.to_thread(self.store.active)
        allowed = self._allowed([b for b in batches if b["status"] == "in_progress"], time.time())
        free = allowed - len(self.in_flight)
        queues: dict[str, tuple[dict[str, Any], list[tuple[int, str, dict[str, Any]]]]] = {}
        for batch in batches:
            bid = batch["id"]
            mine = {idx for (b, idx) in self.in_flight if b == bid}
            expired = time.time() > batch["expires_at"]
            if batch["status"] == "cancelling" or expired:
                # its lines in flight are abandoned now (their queue slots and seats freed), not
                # waited out: a line retried or queued could hold the batch open for its whole deadline
                for idx in mine:
                    self.in_flight[(bid, idx)].cancel()
                if not mine:  # once they are gone (each task's done callback wakes the runner)
                    await asyncio.to_thread(self.store.finalize, bid, "expired" if expired else "cancelled")
                    self._seen.pop(bid, None)
                    self._served.pop(bid, None)
                    self._models.pop(bid, None)
                continue
            # at least one, to tell "nothing pending" from "no seat free"
            todo = await asyncio.to_thread(self.store.pending, bid, mine, max(free, 1))
            if not todo and not mine:
                await asyncio.to_thread(self.store.finalize, bid, "completed")
                self._seen.pop(bid, None)
                self._served.pop(bid, None)
                self._models.pop(bid, None)
            elif todo:
                queues[bid] = (batch, todo)
        for bid, (batch, (idx, cid, body)) in self._share(queues, {b["id"]: b["owner"] for b in batches}, free):
            if isinstance(body, dict) and isinstance(body.get("model"), str):
                self._models.setdefault(bid, body["model"])
            task = self.in_flight[(bid, idx)] = asyncio.create_task(self._line(bid, batch, idx, cid, body))
            # a callback, not the coroutine's finally: a task cancelled before it ran never runs that
            task.add_done_callback(lambda t, key=(bid, idx): self._done(key, t))

    def _share(self, queues: dict[str, tuple[dict[str, Any], list[Any]]], owners: dict[str, str],
               free: int) -> list[tuple[str, tuple[dict[str, Any], Any]]]:
        """The ``free`` seats, one at a time, each to a batch of the key holding the fewest lines
        in flight, of those the key served longest ago (then likewise per batch, then the oldest):
        one key's backlog, or its many batches, never holds another key's batch back until it is done."""
        by_key: dict[str, int] = {}
        by_batch: dict[str, int] = {}
        for bid, _ in self.in_flight:
            by_batch[bid] = by_batch.get(bid, 0) + 1
            if bid in owners:
                by_key[owners[bid]] = by_key.get(owners[bid], 0) + 1
        order = {bid: i for i, bid in enumerate(queues)}  # (active() lists them oldest first)
        taken: list[tuple[str, tuple[dict[str, Any], Any]]] = []
        for _ in range(max(free, 0)):
            ready = [bid for bid, (_, todo) in queues.items() if todo]
            if not ready:
                break
            bid = min(ready, key=lambda b: (by_key.get(owners[b], 0), self._served.get(owners[b], -1),
                                            by_batch.get(b, 0), self._served.get(b, -1), order[b]))
            batch, todo = queues[bid]
            taken.append((bid, (batch, todo.pop(0))))
            self._turn += 1
            self._served[owners[bid]] = self._served[bid] = self._turn
            by_key[owners[bid]] = by_key.get(owners[bid], 0) + 1
            by_batch[bid] = by_batch.get(bid, 0) + 1
        return taken

    def _done(self, key: tuple[str, int], task: asyncio.Task) -> None:
        if self.in_flight.get(key) is task:
            del self.in_flight[key]
        self.wake.set()

    async def _line(self, bid: str, batch: dict[str, Any], idx: int, cid: str, body: dict[str, Any]) -> None:
        endpoint, owner = batch["endpoint"], batch["owner"]
        try:
            while True:
                status, reply = await self._send(endpoint, body, owner)
                if status not in _RETRY or _budget_spent(reply):
                    break
                await asyncio.sleep(self.config.retry_interval_s)
                batch = await asyncio.to_thread(self.store.stored, bid)  # (no counts nor usage summed)
                if batch is None or batch["status"] != "in_progress" or time.time() > batch["expires_at"]:
                    return  # cancelled or expired meanwhile: finalize fails the line
            result = line_result(bid, idx, cid, status=status, body=reply)
            await asyncio.to_thread(self.store.finish_line, bid, idx, status == 200, result)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - that line fails, alone
            log.exception("batch %s line %d failed", bid, idx)
            err = {"code": "internal_error", "message": f"{type(e).__name__}: {e}"}
            await asyncio.to_thread(self.store.finish_line, bid, idx, False, line_result(bid, idx, cid, error=err))

    async def _send(self, endpoint: str, body: dict[str, Any], owner: str) -> tuple[int, Any]:
        assert self.app is not None, "the runner starts with the gateway app"
        scope = {"type": "http", "http_version": "1.1", "scheme": "http", "root_path": "", "client": None,
                 "server": None, "headers": [(b"accept", b"application/json")]}
        name = self.budget_keys.get(owner)
        privileges = BATCH_ONLY if name is None else replace(BATCH_ONLY, key=name, budget_only=True)
        resp = await call(self.app, scope, endpoint, body, extra={PRIVILEGES_KEY: privileges, OWNER_KEY: owner})
        try:
            return resp.status, await resp.json()
        finally:  # a line cancelled while its body is read: the inner request is abandoned too
            await resp.close()


def _budget_spent(reply: Any) -> bool:
    """A 429 that waiting out would not mend within a line's retries: the key's budget."""
    error = reply.get("error") if isinstance(reply, dict) else None
    return isinstance(error, dict) and error.get("code") == "insufficient_quota"
