"""The multi-process engine client: an engine core in a child process.

The API process keeps the tokenizer: it tokenises and validates a request at once
with the same input processor as in-thread (bad input fails fast), sends it, and
hands each output to the request's stream from one reader task on the event loop. The engine process
(``llmserve.engine.core_proc``) sends one message per step with every output of
that step, the stats events for the Prometheus histograms, and now and then a
snapshot that ``/load`` and ``/metrics`` read.

Death: a ``dead`` message (a step failed for the whole batch) or the child found
gone (``waitpid``; killed, crashed) ends every stream with ``EngineDeadError`` and
makes ``is_alive()`` False, so ``/ready`` answers 503.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from llmserve.engine.client import EngineDeadError, RequestStreams
from llmserve.engine.core_proc import EngineProcHandle
from llmserve.engine.input_processor import InputProcessor
from llmserve.engine.outputs import RequestOutput
from llmserve.engine.sampling_params import SamplingParams
from llmserve.engine.wire import decode_output, encode_request, pack, unpack

log = logging.getLogger(__name__)

WATCH_EVERY_S = 0.2


class MultiProcessEngine(RequestStreams):
    """The engine client whose core runs in its own process (``core_proc``)."""

    def __init__(self, handle: EngineProcHandle, tokenizer: Any) -> None:
        import zmq
        import zmq.asyncio

        self.handle = handle
        self.tokenizer = tokenizer
        self.death: str | None = None
        self.last_heartbeat = time.monotonic()
        self.info: dict[str, Any] = {}
        self._grammar = None  # built while the instance warms up (warm_grammar)
        self._grammar_lock = threading.Lock()
        self._exit_code: int | None = None
        self._ctx = zmq.asyncio.Context()
        self._tx = self._ctx.socket(zmq.PUSH)
        self._tx.setsockopt(zmq.LINGER, 0)
        self._tx.bind(handle.in_addr)
        self._rx = self._ctx.socket(zmq.PULL)
        self._rx.bind(handle.out_addr)
        self._streams: dict[str, tuple[asyncio.Queue, list[int], str | None]] = {}
        self._listeners: list[Any] = []
        self._snapshot: dict[str, Any] = {}
        self._ids = itertools.count()
        self.inputs: InputProcessor | None = None  # once the child says its limits
        self.lora: dict[str, Any] = {"adapters": {}, "resident": [], "loaded": []}  # ops.lora_state
        self._lora_calls: dict[int, asyncio.Future] = {}
        self._tasks: list[asyncio.Task] = []

    # ---- start ------------------------------------------------------------------------
    async def connect(self) -> "MultiProcessEngine":
        """Wait for the child's ``ready`` (raising its build error), then start reading."""
        gone = False
        while True:
            if await self._rx.poll(int(WATCH_EVERY_S * 1000)):
                msg = unpack(await self._rx.recv())
                if msg[0] == "failed":
                    self._reap(block=True)
                    if msg[2]:  # a bad model file or flag: the CLI says it in one line, exit 2
                        from llmserve.models.errors import FlagError, ModelLoadError

                        raise (FlagError if msg[2] == "flag" else ModelLoadError)(msg[1])
                    raise RuntimeError(msg[1])
                if msg[0] == "ready":
                    break
            elif gone:
                raise RuntimeError(f"the engine process exited during start ({self._exit_code})")
            else:
                gone = self._child_gone()  # one more poll then: its "failed" may still be in flight
        self.info = info = msg[1]
        self.lora = info["lora"]
        # Grammars compile where they run, in the engine process (a compiled one cannot cross
        # the wire); ``compile_grammar`` below checks a schema here first.
        self.inputs = InputProcessor(self.tokenizer if info["has_tokenizer"] else None, info["vocab_size"],
                                     info["max_model_len"], frozenset(info["eos_token_ids"]))
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._watch())]
        return self

    # ---- the EngineClient interface ---------------------------------------------------------
    def compile_grammar(self, params: SamplingParams):
        """Check a structured output's grammar here, before the first byte: a bad one is the
        client's 400. The engine process compiles its own copy (none crosses the wire)."""
        if params.structured_outputs is None:
            return None
        return self.warm_grammar().backend.compile(params.structured_outputs)

    def warm_grammar(self):
        """This process's grammar info, built now (the instance calls it while warming up)."""
        if self.tokenizer is None:
            return None
        with self._grammar_lock:
            if self._grammar is None:
                from llmserve.engine.guided import GuidedDecoding

                self._grammar = GuidedDecoding.for_tokenizer(self.tokenizer, self.vocab_size,
                                                             self.inputs.eos_token_ids)
        return self._grammar

    @property
    def max_model_len(self) -> int:
        return self.info["max_model_len"]

    @property
    def vocab_size(self) -> int:
        return self.info["vocab_size"]

    @property
    def model_name(self) -> str:
        return self.info["model_name"]

    @property
    def sampling_defaults(self) -> dict[str, Any]:
        return self.info.get("sampling_defaults") or {}

    def is_alive(self) -> bool:
        if self.death is None and self._child_gone():
            self._die(f"the engine process exited ({self._exit_code})")
        return self.death is None

    def add_request(self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None,
                    *, priority: int | str | None = 0, cache_salt: str | None = None,
                    arrival_time: float | None = None,
                    resume_token_ids: list[int] | None = None,
                    trace: str | None = None, lora_name: str | None = None) -> AsyncIterator[RequestOutput]:
        if not self.is_alive():
            raise EngineDeadError(f"the engine is not running: {self.death}")
        rid = request_id or f"req-{next(self._ids)}"
        req, text = self.inputs.process(rid, prompt, params, priority=priority, cache_salt=cache_salt,
                                        arrival_time=arrival_time, resume_token_ids=resume_token_ids,
                                        lora_name=lora_name)
        req.trace = trace  # a W3C traceparent: the engine process records its spans
        q: asyncio.Queue = asyncio.Queue()
        self._streams[rid] = (q, req.prompt_token_ids, text)
        self._send(["add", encode_request(req, text)])
        return self._stream(rid, q)

    def abort(self, request_id: str) -> None:
        if self.death is None:
            self._send(["abort", request_id])

    async def load_lora(self, name: str, path: str) -> None:
        """The engine process reads the adapter on a worker thread and registers it between
        steps; ``LoraError`` / ``UnknownAdapter`` come back as raised there."""
        await self._lora_call(["lora_load", name, path])

    async def unload_lora(self, name: str) -> None:
        await self._lora_call(["lora_unload", name])

    async def _lora_call(self, msg: list) -> None:
        if not self.is_alive():
            raise EngineDeadError(f"the engine is not running: {self.death}")
        token = next(self._ids)
        fut = self._lora_calls[token] = asyncio.get_running_loop().create_future()
        self._send([msg[0], token, *msg[1:]])
        try:
            self.lora = await fut
        finally:
            self._lora_calls.pop(token, None)

    def set_threads(self, n: int) -> None:
        """The engine process's torch threads from its next step on."""
        if n < 1:
            raise ValueError(f"threads must be >= 1, got {n}")
        if self.death is None:
            self._send(["threads", int(n)])

    def load_snapshot(self) -> dict[str, Any]:
        return dict(self._snapshot)

    def snapshot(self) -> dict[str, Any]:
        return self._snapshot

    def add_stats_listener(self, listener: Any) -> None:
        self._listeners.append(listener)

    def shutdown(self, timeout: float = 5.0) -> None:
        for t in self._tasks:
            t.cancel()
        if self._exit_code is None:
            try:
                self._send(["shutdown"])
            except Exception:  # noqa: BLE001 - the socket may be gone; the kill below still ends it
                pass
            deadline = time.monotonic() + timeout
            while not self._child_gone() and time.monotonic() < deadline:
                time.sleep(0.02)
            if self._exit_code is None:
                os.kill(self.handle.pid, signal.SIGKILL)
                self._reap(block=True)
        self._tx.close(0)
        self._rx.close(0)
        self._ctx.term()
        shutil.rmtree(self.handle.ipc_dir, ignore_errors=True)

    # ---- inside ---------------------------------------------------------------------------
    def _send(self, msg: list) -> None:
        self._tx.send(pack(msg))  # (a PUSH to a connected peer queues; the future needs no await)

    async def _read(self) -> None:
        try:
            while True:
                msg = unpack(await self._rx.recv())
                self.last_heartbeat = time.monotonic()
                kind = msg[0]
                if kind == "out":
                    self._deliver(msg[1], msg[2], msg[3])
                elif kind == "error":  # a request refused at enqueue, as raised there
                    from llmserve.engine.lora.ops import error_of

                    self._put(msg[1], error_of(msg[2], msg[3]))
                elif kind == "lora":  # ["lora", token, error kind or None, message, state]
                    from llmserve.engine.lora.ops import error_of

                    self.lora = msg[4]  # (token -1: no call; an adapter the engine dropped itself)
                    fut = self._lora_calls.get(msg[1])
                    if fut is not None and not fut.done():
                        fut.set_result(msg[4]) if msg[2] is None else fut.set_exception(error_of(msg[2], msg[3]))
                elif kind == "dead":
                    self._die(msg[1])
                    return
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a reader that stops would leave every stream hanging
            log.exception("the engine reader failed")
            self._die(f"the engine reader failed: {type(e).__name__}: {e}")

    def _deliver(self, outs: list, events: list, snap: dict | None) -> None:
        for m in outs:
            target = self._streams.get(m[0])
            if target is not None:
                q, ids, text = target
                q.put_nowait(decode_output(m, ids, text))
        for ev in events:
            for lst in self._listeners:
                getattr(lst, ev[0])(*ev[1:])
        if snap is not None:
            self._snapshot = snap

    async def _watch(self) -> None:
        while self.death is None:
            await asyncio.sleep(WATCH_EVERY_S)
            self.is_alive()

    def _put(self, rid: str, item: Any) -> None:
        target = self._streams.get(rid)
        if target is not None:
            target[0].put_nowait(item)

    def _die(self, reason: str) -> None:
        if self.death is not None:
            return
        self.death = reason
        log.error("engine process dead: %s", reason)
        err = EngineDeadError(reason)
        for q, _, _ in list(self._streams.values()):
            q.put_nowait(err)
        for fut in self._lora_calls.values():
            fut.done() or fut.set_exception(err)
        if not self._child_gone():
            try:
                os.kill(self.handle.pid, signal.SIGKILL)  # a step failed: nothing more to serve from it
            except ProcessLookupError:
                pass
            self._reap(block=True)

    def _child_gone(self) -> bool:
        if self._exit_code is None:
            self._reap(block=False)
        return self._exit_code is not None

    def _reap(self, block: bool) -> None:
        if self._exit_code is not None:
            return
        try:
            pid, status = os.waitpid(self.handle.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            self._exit_code = -1
            return
        if pid:
            self._exit_code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
