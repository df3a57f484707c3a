"""asyncio front of the engine: a dedicated engine thread, async iterators per request.

The engine core is not thread-safe, so only the engine thread touches it; the
event loop talks to it through a command queue (add / abort) and receives
outputs via ``call_soon_threadsafe``. Tokenising and validation happen on the
caller's side (``prepare_request`` reads no mutable state), so bad input fails
fast without waiting for a step.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from llmserve.engine.engine import EngineCore
from llmserve.engine.outputs import CompletionOutput, RequestOutput
from llmserve.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    pass


class AsyncEngine:
    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._ids = itertools.count()
        self._stop = False
        self.last_heartbeat = time.monotonic()
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name="llmserve-engine", daemon=True)
        self._thread.start()

    # ---- public API ---------------------------------------------------------------------
    @property
    def tokenizer(self):
        return self.core.tokenizer

    def is_alive(self) -> bool:
        return self._thread.is_alive() and not self._stop

    def add_request(self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None,
                    *, priority: int | str | None = 0, cache_salt: str | None = None,
                    arrival_time: float | None = None) -> AsyncIterator[RequestOutput]:
        """Validate now (raising ``ValueError`` at once), then return the output stream.

        The stream yields incremental outputs (``delta_text`` / ``delta_token_ids``)
        until finished; only the final one also carries the whole text and token ids
        (see ``CompletionOutput``). Closing or cancelling it (client gone) aborts the request and
        frees its KV blocks.
        """
        if not self.is_alive():
            raise EngineDeadError("the engine loop is not running")
        rid = request_id or f"req-{next(self._ids)}"
        req, text = self.core.prepare_request(rid, prompt, params, priority=priority,
                                              cache_salt=cache_salt, arrival_time=arrival_time)
        q: asyncio.Queue = asyncio.Queue()
        self._streams[rid] = (asyncio.get_running_loop(), q)
        self._cmds.put(("add", req, text))
        self._wake.set()
        return self._stream(rid, q)

    async def _stream(self, rid: str, q: asyncio.Queue) -> AsyncIterator[RequestOutput]:
        finished = False
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            self._streams.pop(rid, None)
            if not finished:
                self.abort(rid)

    async def generate(self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None,
                       **kw: Any) -> AsyncIterator[RequestOutput]:
        """``add_request`` and iterate, as one async generator."""
        async for out in self.add_request(prompt, params, request_id, **kw):
            yield out

    def abort(self, request_id: str) -> None:
        self._cmds.put(("abort", request_id, None))
        self._wake.set()

    def call(self, fn, *args) -> "asyncio.Future[Any]":
        """Run ``fn(core, *args)`` on the engine thread (for snapshots that must be consistent)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._cmds.put(("call", (fn, args, loop, fut), None))
        self._wake.set()
        return fut

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=5)

    # ---- engine thread ------------------------------------------------------------------------
    def _deliver(self, rid: str, item: Any) -> None:
        target = self._streams.get(rid)
        if target is None:
            return
        loop, q = target
        try:
            loop.call_soon_threadsafe(q.put_nowait, item)
        except RuntimeError:  # the loop is closed
            pass

    def _drain_commands(self) -> None:
        while True:
            try:
                kind, a, b = self._cmds.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                try:
                    self.core.enqueue(a, b)
                except ValueError as e:
                    self._deliver(a.request_id, e)
            elif kind == "abort":
                out = self.core.abort_request(a)
                if out is not None:
                    self._deliver(a, out)
            elif kind == "call":
                fn, args, loop, fut = a
                try:
                    res = fn(self.core, *args)
                    loop.call_soon_threadsafe(lambda r=res: fut.done() or fut.set_result(r))
                except Exception as e:  # noqa: BLE001 - handed to the caller
                    loop.call_soon_threadsafe(lambda e=e: fut.done() or fut.set_exception(e))

    def _run(self) -> None:
        while not self._stop:
            self.last_heartbeat = time.monotonic()
            self._drain_commands()
            if not self.core.has_unfinished():
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                outputs = self.core.step()
            except Exception as e:  # noqa: BLE001 - keep serving: fail the batch, not the engine
                log.exception("engine step failed; aborting in-flight requests")
                self.errors += 1
                self._fail_all(e)
                continue
            for out in outputs:
                self._deliver(out.request_id, out)

    def _fail_all(self, err: Exception) -> None:
        for rid in list(self.core.scheduler.requests):
            self.core.abort_request(rid)
            self._deliver(rid, RuntimeError(f"engine step failed: {err}"))


def merge_choices(outs: list[RequestOutput], request_id: str) -> RequestOutput:
    """Combine the final outputs of ``n`` fan-out sequences into one output with n choices."""
    comps = []
    for i, o in enumerate(outs):
        c = o.outputs[0]
        comps.append(CompletionOutput(i, c.text, c.token_ids, c.finish_reason, c.stop_reason, c.logprobs))
    first = outs[0]
    return RequestOutput(request_id, first.prompt_token_ids, comps, all(o.finished for o in outs),
                         first.prompt, first.num_cached_tokens, first.metrics)
