"""Every replica's request signals, for the one controller that scales the pools.

The elastic controller sizes a pool from what the gateway sees: arrivals, first
tokens, finishes, the batch queue's need. With ``serve --replicas`` it runs in one
replica (``state.pools: publish``), which proxies only its share of the requests.
So every other replica (``follow``) forwards what its requests tell its observers:
the events are buffered and pushed to one Redis list every ``interval_s`` as one
JSON batch; the controller's replica takes the whole list at the same pace and
replays each event into its own observers, as if it had proxied the request.

Times travel as wall-clock seconds (each side converts from and to its own
monotonic clock), so replicas on other nodes with synchronised clocks agree. Each
batch is validated before any of it is replayed; a malformed one is dropped whole.
Signals are a rate: while the store is away the forwarded ones are dropped, not
hoarded, and the list is capped so that a controller gone for long reads only the
newest.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationError

from llmserve.state.store import OUTAGE

log = logging.getLogger(__name__)

MAX_BATCHES = 2_000  # about 15 minutes of batches at 2 a second

Arrival = tuple[Literal["arrival"], str, str, float, int, bool]
FirstToken = tuple[Literal["first_token"], str, str, float, float, bool]
Finish = tuple[Literal["finish"], str, str, float, float, int, bool, bool]
BatchNeed = tuple[Literal["batch_need"], str, float]
_BATCH = TypeAdapter(list[Arrival | FirstToken | Finish | BatchNeed])


def _wall_offset() -> float:
    return time.time() - time.monotonic()


class SignalForwarder:
    """A request observer that buffers what it is told, for :meth:`flush`."""

    def __init__(self, client: Any, key: str = "llmserve:signals") -> None:
        self._r, self.key = client, key
        self._buf: list[list] = []
        self.dropped = 0

    def on_arrival(self, model: str, version: str, t: float, prompt_chars: int, batch: bool = False) -> None:
        self._buf.append(["arrival", model, version, t + _wall_offset(), prompt_chars, batch])

    def on_first_token(self, model: str, version: str, t: float, ttft_s: float, batch: bool = False) -> None:
        self._buf.append(["first_token", model, version, t + _wall_offset(), ttft_s, batch])

    def on_finish(self, model: str, version: str, t: float, e2e_s: float, output_tokens: int,
                  ok: bool, batch: bool = False) -> None:
        self._buf.append(["finish", model, version, t + _wall_offset(), e2e_s, output_tokens, ok, batch])

    def on_batch_need(self, model: str, lines_per_s: float) -> None:
        self._buf.append(["batch_need", model, lines_per_s])

    async def step(self) -> None:
        """Push what was buffered as one batch."""
        if not self._buf:
            return
        batch, self._buf = self._buf, []
        try:
            async with self._r.pipeline(transaction=True) as p:
                await p.rpush(self.key, json.dumps(batch)).ltrim(self.key, -MAX_BATCHES, -1).execute()
        except OUTAGE:
            self.dropped += len(batch)


class SignalIntake:
    """Takes every forwarded batch and replays it into ``observers()``."""

    def __init__(self, client: Any, observers: Callable[[], list], key: str = "llmserve:signals") -> None:
        self._r, self.key, self._observers = client, key, observers
        self.replayed = 0

    async def step(self) -> None:
        try:
            async with self._r.pipeline(transaction=True) as p:
                raw, _ = await p.lrange(self.key, 0, -1).delete(self.key).execute()
        except OUTAGE:
            return  # the next step takes what was pushed meanwhile
        offset = _wall_offset()
        for item in raw:
            try:
                events = _BATCH.validate_python(json.loads(item))
            except (ValueError, ValidationError) as e:
                log.warning("dropping a malformed signal batch: %s", str(e).splitlines()[0])
                continue
            for ev in events:
                self._replay(ev, offset)

    def _replay(self, ev: tuple, offset: float) -> None:
        kind = ev[0]
        for o in self._observers():
            if isinstance(o, SignalForwarder):
                continue
            if kind == "arrival":
                o.on_arrival(ev[1], ev[2], ev[3] - offset, ev[4], ev[5])
            elif kind == "first_token":
                o.on_first_token(ev[1], ev[2], ev[3] - offset, ev[4], ev[5])
            elif kind == "finish":
                o.on_finish(ev[1], ev[2], ev[3] - offset, ev[4], ev[5], ev[6], ev[7])
            else:
                o.on_batch_need(ev[1], ev[2])
        self.replayed += 1


class Relay:
    """Runs ``side.step()`` every ``interval_s`` (a forwarder, an intake, an outcome share)."""

    def __init__(self, side: Any, interval_s: float = 0.5) -> None:
        self.side, self.interval_s = side, interval_s
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="shared-state-relay")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.side.step()
            except Exception:  # a bad step must not end the relay
                log.exception("relay step failed: %r", self.side)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
        with suppress(Exception):
            await self.side.step()  # the last batch (forwarder) or the last replay (intake)
