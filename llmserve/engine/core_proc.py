"""The engine core in a process of its own: a busy loop behind two ZeroMQ sockets.

vLLM v1's EngineCoreProc shape. In one process the event loop (HTTP, SSE) and the
engine thread took turns on one GIL, and a step's OpenMP threads waited for
whichever of them held it: with two torch threads a single stream's time per
token doubled. Here the API process only tokenises, streams and speaks HTTP; the
child owns the scheduler, the model and its cores.

The child is forked (not spawned) so it starts with the parent's imports done:
``start`` must run while the parent has one thread (before the event loop), and
the child creates its own ZeroMQ context after the fork. Messages are msgpack
lists (``llmserve.engine.wire``), never pickle:

- in (PULL): ``["add", request]``, ``["abort", id]``, ``["threads", n]``, ``["shutdown"]``,
  ``["lora_load", token, name, path]``, ``["lora_unload", token, name]``;
- out (PUSH): ``["ready", info]`` or ``["failed", why, fault]`` once (``fault``: "model", a
  ``ModelLoadError``, or "flag", a ``FlagError``, not a bug; "" a bug), then per step
  ``["out", outputs, stats_events, snapshot_or_None]``, ``["error", id, kind, msg]``
  when a request is refused, ``["lora", token, error_kind, msg, state]`` answering a LoRA
  command (the file is read on a worker thread), and ``["dead", why]`` before the child exits when a
  step fails for the whole batch.

The child ignores SIGTERM/SIGINT (the API process drains, then says shutdown)
and dies with its parent.

Structured-output grammars compile on a worker thread (xgrammar releases the GIL
while it compiles): a new schema never stalls the step loop, and its request joins
the batch once its grammar is ready. The tokenizer's grammar info is built before
``ready``.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from llmserve.engine.lora.ops import lora_state
from llmserve.engine.wire import decode_request, encode_output, pack, unpack

log = logging.getLogger(__name__)

SNAPSHOT_EVERY_S = 0.05  # /load and /metrics read the last one; a step is ~10 ms
IDLE_POLL_MS = 1000
COMPILE_POLL_MS = 2  # while a grammar compiles and nothing else runs


@dataclass(slots=True)
class EngineProcHandle:
    """What the parent holds of a started child."""

    pid: int
    in_addr: str
    out_addr: str
    ipc_dir: str


IPC_PREFIX = "llmserve-engine-"
_IPC_NAME = re.compile(re.escape(IPC_PREFIX) + r"(\d+)-\w+")  # the owner's pid, then mkdtemp's suffix


def new_ipc_dir(tmp: str | None = None) -> str:
    """A fresh folder for the two sockets, named after this process. A process killed before
    its shutdown could remove its folder leaves it behind: folders of this user's processes
    that are gone are removed first."""
    tmp = tmp or tempfile.gettempdir()
    try:
        names = os.listdir(tmp)
    except OSError:
        names = []
    for name in names:
        m = _IPC_NAME.fullmatch(name)
        path = os.path.join(tmp, name)
        if not m or _alive(int(m.group(1))):
            continue
        try:
            if os.stat(path).st_uid == os.getuid():
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass
    return tempfile.mkdtemp(prefix=f"{IPC_PREFIX}{os.getpid()}-", dir=tmp)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive
        return True
    return True


def can_fork() -> bool:
    """Fork only from a single-threaded process: a thread's held lock would be copied locked."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return threading.active_count() == 1


def start(build: Callable[[], Any], ipc_dir: str) -> EngineProcHandle:
    """Fork the engine process; it builds its core with ``build()`` and serves the loop."""
    in_addr, out_addr = f"ipc://{ipc_dir}/in", f"ipc://{ipc_dir}/out"
    sys.stdout.flush()
    sys.stderr.flush()
    # Objects from before the fork (torch's modules, the tokenizer) leave the collector's
    # view: its passes would write to every one of them and copy their pages into both processes.
    gc.collect()
    gc.freeze()
    pid = os.fork()
    if pid == 0:
        _child(build, in_addr, out_addr)  # never returns
    return EngineProcHandle(pid, in_addr, out_addr, ipc_dir)


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _child(build: Callable[[], Any], in_addr: str, out_addr: str) -> None:
    code = 1
    try:
        _die_with_parent()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        import zmq

        ctx = zmq.Context()
        rx = ctx.socket(zmq.PULL)
        rx.connect(in_addr)
        tx = ctx.socket(zmq.PUSH)
        tx.setsockopt(zmq.LINGER, 2000)
        tx.connect(out_addr)
        try:
            core = build()
        except Exception as e:  # noqa: BLE001 - the parent reports it on /health
            tx.send(pack(["failed", *_build_failure(e)]))
            rx.close(0)
            # The parent binds once its event loop runs, maybe after this: wait for it (a dead
            # parent kills this process), as os._exit below would drop the unsent reason.
            tx.close(linger=30_000)
            ctx.term()
            return
        code = EngineCoreProc(core, rx, tx).run()
        tx.close()
    except BaseException:  # noqa: BLE001 - say why in the log, then exit non-zero
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _build_failure(e: Exception) -> tuple[str, str]:
    """(the reason the parent reports in one line, who is at fault: "model", "flag" or "").
    A bad model file (``ModelLoadError``) or flag (``FlagError``) names itself and the fault,
    and the parent raises it again as one (the CLI's exit 2); anything else is a bug, whose
    traceback goes to the log."""
    from llmserve.models.errors import FlagError, ModelLoadError

    if isinstance(e, ModelLoadError):
        return str(e), "model"
    if isinstance(e, FlagError):
        return str(e), "flag"
    log.exception("engine build failed")
    return f"{type(e).__name__}: {e}", ""


class _Recorder:
    """Collects the core's stats-listener calls to replay them in the API process."""

    def __init__(self) -> None:
        self.events: list[list] = []

    def on_scheduled(self, queue_time: float) -> None:
        self.events.append(["on_scheduled", queue_time])

    def on_first_token(self, ttft: float) -> None:
        self.events.append(["on_first_token", ttft])

    def on_tokens(self, n: int, gap: float | None) -> None:
        self.events.append(["on_tokens", n, gap])

    def on_finished(self, reason: str, e2e: float, prompt_tokens: int, output_tokens: int) -> None:
        self.events.append(["on_finished", reason, e2e, prompt_tokens, output_tokens])

    def take(self) -> list[list]:
        ev, self.events = self.events, []
        return ev


def ready_info(core) -> dict[str, Any]:
    tok = core.tokenizer
    return {"max_model_len": core.max_model_len, "vocab_size": core.model_config.vocab_size,
            "model_name": core.model_config.name, "eos_token_ids": sorted(core.eos_token_ids),
            "has_tokenizer": tok is not None, "pid": os.getpid(), "threads": _torch_threads(),
            "lora": lora_state(core.lora), "sampling_defaults": dict(core.model_config.sampling_defaults),
            **model_facts(core.model_config)}


def model_facts(config) -> dict[str, Any]:
    """What ``/v1/models`` says of the model beyond its name."""
    return {"family": config.family, "context_length": config.max_position_embeddings}


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


class EngineCoreProc:
    """The child's loop: drain commands, step, send the step's outputs in one message."""

    def __init__(self, core, rx, tx) -> None:
        from llmserve.engine.stats import core_snapshot

        self.core, self.rx, self.tx = core, rx, tx
        self._snapshot = core_snapshot
        self.rec = _Recorder()
        core.stats.listeners.append(self.rec)
        self._last_snap = 0.0
        from concurrent.futures import ThreadPoolExecutor

        from llmserve.engine.grammar import background_thread

        self._compiler = ThreadPoolExecutor(1, thread_name_prefix="grammar", initializer=background_thread)
        self._compiling: dict[str, tuple[Any, Any, str | None]] = {}  # id -> (future, request, prompt text)
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="lora")
        self._reading: dict[int, Any] = {}  # token -> the adapter file's read

    def run(self) -> int:
        import zmq

        core = self.core
        core.warm_grammar()
        self.tx.send(pack(["ready", ready_info(core)]))
        self.tx.send(pack(["out", [], [], self._snapshot(core)]))
        poller = zmq.Poller()
        poller.register(self.rx, zmq.POLLIN)
        while True:
            self._admit_compiled()
            self._add_read_adapters()
            busy = core.has_unfinished()
            wait = 0 if busy else COMPILE_POLL_MS if self._compiling or self._reading else IDLE_POLL_MS
            if poller.poll(wait):
                while True:
                    try:
                        msg = unpack(self.rx.recv(zmq.NOBLOCK))
                    except zmq.Again:
                        break
                    if msg[0] == "shutdown":
                        self._compiler.shutdown(wait=False, cancel_futures=True)
                        self._reader.shutdown(wait=False, cancel_futures=True)
                        return 0
                    self._command(msg)
            if not core.has_unfinished():
                if busy:  # just went idle: /load should say so
                    self._send([], force=True)
                continue
            try:
                outputs = core.step()
            except Exception as e:  # noqa: BLE001 - the batch itself failed: this engine is done
                log.exception("engine step failed for the whole batch; the engine is dead")
                self.tx.send(pack(["dead", f"engine step failed: {type(e).__name__}: {e}"]))
                return 1
            self._send(outputs, force=any(o.finished for o in outputs))

    def _command(self, msg: list) -> None:
        kind = msg[0]
        if kind == "add":
            req, text = decode_request(msg[1])
            if req.sampling_params.structured_outputs is not None:
                fut = self._compiler.submit(self.core.compile_grammar, req.sampling_params)
                self._compiling[req.request_id] = (fut, req, text)
                return
            self._enqueue(req, text, None)
        elif kind == "threads":
            self.core.set_threads(int(msg[1]))
            self._send([], force=True)  # /load says so at once, idle or not
        elif kind == "lora_load":
            from llmserve.engine.lora import ops

            try:
                self._reading[msg[1]] = self._reader.submit(ops.need(self.core.lora).read, msg[2], msg[3])
            except Exception as e:  # noqa: BLE001 - answered to the caller
                self._lora_reply(msg[1], e)
        elif kind == "lora_unload":
            from llmserve.engine.lora import ops

            try:
                ops.remove(self.core.lora, msg[2])
                self._lora_reply(msg[1], None)
            except Exception as e:  # noqa: BLE001 - answered to the caller
                self._lora_reply(msg[1], e)
        elif kind == "abort":
            if self._compiling.pop(msg[1], None) is not None:
                return  # not in the engine yet: its grammar is dropped when it is done
            out = self.core.abort_request(msg[1])
            if out is not None:
                self._send([out], force=True)

    def _admit_compiled(self) -> None:
        """Requests whose grammar finished compiling join the engine, in arrival order."""
        for rid in [rid for rid, (fut, _, _) in self._compiling.items() if fut.done()]:
            fut, req, text = self._compiling.pop(rid)
            self._enqueue(req, text, fut)

    def _add_read_adapters(self) -> None:
        """Adapters whose file is read and checked join the registry, between steps."""
        from llmserve.engine.lora import ops

        for token in [t for t, fut in self._reading.items() if fut.done()]:
            try:
                ops.add(self.core.lora, self._reading.pop(token).result())
                self._lora_reply(token, None)
            except Exception as e:  # noqa: BLE001 - a bad file is the caller's 400
                self._lora_reply(token, e)

    def _lora_reply(self, token: int, error: Exception | None) -> None:
        from llmserve.engine.lora.ops import error_kind

        kind = None if error is None else error_kind(error)
        self.tx.send(pack(["lora", token, kind, "" if error is None else str(error), lora_state(self.core.lora)]))
        self._send([], force=True)  # /load lists the adapters at once

    def _enqueue(self, req, text: str | None, compiled) -> None:
        try:
            if compiled is not None:
                req.grammar = compiled.result()
            self.core.enqueue(req, text)
        except Exception as e:  # noqa: BLE001 - this request's own input: only its stream ends
            from llmserve.engine.lora.ops import error_kind

            kind = error_kind(e)
            self.tx.send(pack(["error", req.request_id, kind, str(e)]))
            if kind == "unavailable":  # the adapter was unregistered: /v1/models says so
                self.tx.send(pack(["lora", -1, None, "", lora_state(self.core.lora)]))

    def _send(self, outputs: list, force: bool) -> None:
        now = time.monotonic()
        snap = None
        if force or now - self._last_snap >= SNAPSHOT_EVERY_S:
            snap = self._snapshot(self.core)
            self._last_snap = now
        self.tx.send(pack(["out", [encode_output(o) for o in outputs], self.rec.take(), snap]))
