"""The in-thread engine client: the core on a dedicated thread, async iterators per request.

The engine core is not thread-safe, so only the engine thread touches it; the
event loop talks to it through a command queue (add / abort) and receives
outputs via ``call_soon_threadsafe``. The input processor checks and tokenises on
the caller's side (it reads no mutable state), so bad input fails fast without
waiting for a step. A batch's fault or a crashed loop kills the engine (see
``llmserve.engine.client``), so the server's ``/ready`` says so and the instance
gets replaced.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from llmserve.engine.client import EngineDeadError, RequestStreams
from llmserve.engine.engine import EngineCore
from llmserve.engine.outputs import RequestOutput
from llmserve.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class InThreadEngine(RequestStreams):
    """The engine client whose core runs on a thread of this process."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.inputs = core.inputs  # reads no state the engine thread changes
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._ids = itertools.count()
        self._stop = False
        self.death: str | None = None  # why the engine died; None while it runs
        self.last_heartbeat = time.monotonic()
        from llmserve.engine.lora.ops import lora_state

        self.lora = lora_state(core.lora)  # what the server lists; replaced by each load / unload
        self._thread = threading.Thread(target=self._run, name="llmserve-engine", daemon=True)
        self._thread.start()

    @classmethod
    async def start(cls, build: Callable[[], EngineCore]) -> "InThreadEngine":
        """Build the core off the event loop (a model load takes seconds), then run it."""
        return cls(await asyncio.to_thread(build))

    # ---- public API ---------------------------------------------------------------------
    @property
    def tokenizer(self):
        return self.core.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.core.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.core.model_config.vocab_size

    @property
    def model_name(self) -> str:
        return self.core.model_config.name

    @property
    def sampling_defaults(self) -> dict[str, Any]:
        return self.core.model_config.sampling_defaults

    def load_snapshot(self) -> dict[str, Any]:
        return self.core.load_snapshot()

    def compile_grammar(self, params: SamplingParams):
        """Compile (and cache) a structured output's grammar; safe from a worker thread."""
        return self.core.compile_grammar(params)

    def set_threads(self, n: int) -> None:
        self.core.set_threads(n)

    def warm_grammar(self) -> None:
        """Build the tokenizer's grammar info before the first structured-output request."""
        self.core.warm_grammar()

    def snapshot(self) -> dict[str, Any]:
        """What /metrics reads (``core_snapshot``); the same shape as the process engine's."""
        from llmserve.engine.stats import core_snapshot

        return core_snapshot(self.core)

    def add_stats_listener(self, listener: Any) -> None:
        self.core.stats.listeners.append(listener)

    def is_alive(self) -> bool:
        return self._thread.is_alive() and not self._stop and self.death is None

    def add_request(self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None,
                    *, priority: int | str | None = 0, cache_salt: str | None = None,
                    arrival_time: float | None = None,
                    resume_token_ids: list[int] | None = None,
                    trace: str | None = None, lora_name: str | None = None) -> AsyncIterator[RequestOutput]:
        """Validate now (raising ``ValueError`` at once), then return the output stream.

        The stream yields incremental outputs (``delta_text`` / ``delta_token_ids``)
        until finished; only the final one also carries the whole text and token ids
        (see ``CompletionOutput``). Closing or cancelling it (client gone) aborts the request and
        frees its KV blocks.
        """
        if not self.is_alive():
            raise EngineDeadError(f"the engine is not running: {self.death or 'shut down'}")
        rid = request_id or f"req-{next(self._ids)}"
        req, text = self.inputs.process(rid, prompt, params, priority=priority, cache_salt=cache_salt,
                                        arrival_time=arrival_time, resume_token_ids=resume_token_ids,
                                        lora_name=lora_name)
        req.trace = trace  # a W3C traceparent: the engine records its spans
        q: asyncio.Queue = asyncio.Queue()
        self._streams[rid] = (asyncio.get_running_loop(), q)
        self._cmds.put(("add", req, text))
        self._wake.set()
        if self.death is not None:  # died after the check above: its sweep may have missed this stream
            q.put_nowait(EngineDeadError(f"the engine died: {self.death}"))
        return self._stream(rid, q)

    def abort(self, request_id: str) -> None:
        self._cmds.put(("abort", request_id, None))
        self._wake.set()

    async def load_lora(self, name: str, path: str) -> None:
        """Read and check the adapter off the engine thread, then register it there
        (``LoraError``: nothing changed)."""
        from llmserve.engine.lora import ops

        adapter = await asyncio.to_thread(ops.need(self.core.lora).read, name, path)
        self.lora = await self.call(lambda core: ops.add(core.lora, adapter))

    async def unload_lora(self, name: str) -> None:
        from llmserve.engine.lora import ops

        self.lora = await self.call(lambda core: ops.remove(core.lora, name))

    def call(self, fn, *args) -> "asyncio.Future[Any]":
        """Run ``fn(core, *args)`` on the engine thread (for snapshots that must be consistent)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if not self.is_alive():
            fut.set_exception(EngineDeadError(f"the engine is not running: {self.death or 'shut down'}"))
            return fut
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
                except Exception as e:  # noqa: BLE001 - this request's own input: only its stream ends
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
        try:
            self._loop()
        except BaseException as e:  # noqa: BLE001 - a crashed loop must still say why and end every stream
            log.exception("engine loop crashed")
            self._die(f"the engine loop crashed: {type(e).__name__}: {e}")

    def _loop(self) -> None:
        while not self._stop:
            self.last_heartbeat = time.monotonic()
            self._drain_commands()
            if not self.core.has_unfinished():
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                outputs = self.core.step()
            except Exception as e:  # noqa: BLE001 - the batch itself failed: this engine is done
                log.exception("engine step failed for the whole batch; the engine is dead")
                self._die(f"engine step failed: {type(e).__name__}: {e}")
                return
            for out in outputs:
                self._deliver(out.request_id, out)

    def _die(self, reason: str) -> None:
        """Mark the engine dead, then end every request and every open stream with the reason."""
        self.death = reason
        err = EngineDeadError(reason)
        for rid in list(self.core.scheduler.requests):
            try:
                self.core.abort_request(rid)  # frees its blocks
            except Exception:  # noqa: BLE001 - the state may be what killed us; the streams still end
                log.exception("could not abort %s", rid)
        for rid in list(self._streams):
            self._deliver(rid, err)
        while True:  # calls queued before the end would wait forever
            try:
                kind, a, _ = self._cmds.get_nowait()
            except queue.Empty:
                return
            if kind == "call":
                _, _, loop, fut = a
                loop.call_soon_threadsafe(lambda f=fut: f.done() or f.set_exception(err))

