"""A template process that forks engine instances with their imports already done.

Of the ~4 s an instance takes here from spawn to ``/ready``, ~2.5 s is the
interpreter importing torch, FastAPI and the engine. A controller starts
instances when latency is already rising, so it keeps one process that has paid
for those imports once and forks each instance from it (Android's zygote;
multiprocessing's forkserver, which talks pickle and so is not used here).

The template is started with ``python -m llmserve.server.fork_server``
and speaks JSON lines over its stdin / stdout pipes:

- ``{"op": "spawn", "argv": [...], "log": PATH, "env": {...}}`` →
  ``{"spawned": PID}`` or ``{"error": MESSAGE}``: fork, and run
  ``llmserve <argv>`` in the child, its output appended to ``PATH``;
- ``{"op": "signal", "pid": PID, "sig": N}`` → ``{"signalled": PID, "ok": BOOL}``:
  only the template signals its children, so a reaped child's reused PID is never hit;
- ``{"exited": PID, "code": C}`` arrives whenever a child ends (``C`` < 0: killed
  by signal ``-C``, as ``subprocess`` reports it).

Fork is only safe from a single-threaded process: the template runs no threads
and makes no torch call before forking (torch's thread pools start lazily), and
it sets ``OPENBLAS_NUM_THREADS=1`` (its children inherit it) so that importing
numpy starts no BLAS worker pool.
Environment variables are applied in the child after the imports, so a variable
that torch reads at import (``OMP_*``, ``MKL_*``...) needs a plain spawn; the
local provider falls back to one for such specs.

This module imports nothing heavy at the top: the controller side (``Template``)
stays torch-free.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from queue import Empty, Queue
from typing import Any

from llmserve.autoscale.providers.process import _die_with_parent

# xgrammar (and the transformers it imports, ~40 MB) too: every engine process builds its
# grammar info while it warms up, and this way their code and heap are the template's pages.
PRELOAD = ("torch", "llmserve.server.app", "llmserve.engine.llm", "llmserve.models.model_source", "llmserve.server.entry",
           "xgrammar")
# Read at torch's import: a spec that sets one of these is spawned, not forked.
IMPORT_TIME_ENV = ("OMP_", "MKL_", "KMP_", "GOMP_", "TORCH_", "PYTORCH_", "LD_", "PYTHON")


def needs_fresh_process(env: dict[str, str]) -> bool:
    return any(k.startswith(IMPORT_TIME_ENV) for k in env)


def _exit_code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


# ---------------------------------------------------------------------------- the template side

def _run_child(argv: list[str], log: str, env: dict[str, str]) -> None:
    """In the forked child: become a fresh ``llmserve`` process; never returns."""
    code = 1
    try:
        os.setsid()
        _die_with_parent()
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        # As a fresh Python has it: ignored, so a write to a peer that left raises EPIPE. At
        # SIG_DFL a gateway poll that timed out under load killed the instance (exit -13).
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.environ.update(env)
        import random

        import torch

        random.seed()
        torch.seed()  # the template's generator state would repeat in every child
        from llmserve.server.entry import main

        sys.argv = ["llmserve.server", *argv]
        code = main(argv) or 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - report it in the child's log, then exit non-zero
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _handle(msg: dict[str, Any], children: set[int]) -> dict[str, Any]:
    op = msg.get("op")
    if op == "spawn":
        argv, log, env = msg.get("argv"), msg.get("log"), msg.get("env") or {}
        if (not isinstance(argv, list) or not all(isinstance(a, str) for a in argv) or not isinstance(log, str)
                or not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values())):
            return {"error": "spawn needs argv (strings), log (a path) and env (strings)"}
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        pid = os.fork()
        if pid == 0:
            _run_child(argv, log, env)
        children.add(pid)
        return {"spawned": pid}
    if op == "signal":
        pid, sig = msg.get("pid"), msg.get("sig")
        if pid not in children or not isinstance(sig, int):
            return {"signalled": pid, "ok": False}
        os.kill(pid, sig)
        return {"signalled": pid, "ok": True}
    return {"error": f"unknown op {op!r}"}


def serve_forever() -> int:
    """The template's loop: preload, say ready, then fork on request and report exits."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the controller's to handle
    import importlib

    # numpy's OpenBLAS starts a worker pool at import; the engine's arithmetic is torch's.
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    t0 = time.monotonic()
    for name in PRELOAD:
        importlib.import_module(name)
    # what the imports made stays out of the collector's passes in every child, so its pages
    # stay shared with the template instead of being copied into each instance
    gc.collect()
    gc.freeze()
    out = sys.stdout

    def say(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    if threads != 1:  # forking now could copy a lock some thread holds
        say({"error": f"the template has {threads} threads after its imports; it cannot fork safely"})
        return 1
    say({"ready": True, "pid": os.getpid(), "preload_s": round(time.monotonic() - t0, 3)})
    children: set[int] = set()
    buf = b""
    stdin = sys.stdin.fileno()
    while True:
        readable, _, _ = select.select([stdin], [], [], 0.05)
        if readable:
            chunk = os.read(stdin, 65536)
            if not chunk:  # the controller closed the pipe or died: stop the children, then go
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    msg = json.loads(line)
                    reply = _handle(msg, children) if isinstance(msg, dict) else {"error": "not an object"}
                except (ValueError, OSError) as e:
                    reply = {"error": str(e)}
                say(reply)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            say({"exited": pid, "code": _exit_code(status)})
    _stop_children(children, grace_s=30.0)
    return 0


def _stop_children(children: set[int], grace_s: float) -> None:
    """SIGTERM (each engine drains), SIGKILL whatever outlives ``grace_s``, reap all."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        for pid in children:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while children and time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid:
                children.discard(pid)
            else:
                time.sleep(0.05)


# ---------------------------------------------------------------------------- the controller side

class TemplateError(RuntimeError):
    pass


class ForkedProcess:
    """A child of the template, with the part of ``subprocess.Popen``'s interface the providers use."""

    def __init__(self, template: "Template", pid: int) -> None:
        self.template = template
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.template.exit_code(self.pid)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            self.template.signal(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.02)
        return self.returncode  # type: ignore[return-value]


class Template:
    """The controller's handle on a template process (started at once, ready after its imports)."""

    def __init__(self, log_path: Path, reply_timeout_s: float = 30.0) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        self.reply_timeout_s = reply_timeout_s
        with open(log_path, "ab") as log:
            # Popen on the caller's thread: PR_SET_PDEATHSIG follows the thread that forked.
            self.proc = subprocess.Popen([sys.executable, "-m", "llmserve.server.fork_server"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
                                         preexec_fn=_die_with_parent)  # noqa: PLW1509 - only a prctl call
        self._exits: dict[int, int] = {}
        self._replies: Queue[dict[str, Any]] = Queue()
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self.preload_s: float | None = None
        self.error: str | None = None
        self._reader = threading.Thread(target=self._read, name="template-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "exited" in msg:
                self._exits[int(msg["exited"])] = int(msg["code"])
            elif msg.get("ready"):
                self.preload_s = msg.get("preload_s")
                self._ready.set()
            elif "error" in msg and not self._ready.is_set():
                self.error = str(msg["error"])
            else:
                self._replies.put(msg)
        self.error = self.error or f"the template process ended (code {self.proc.wait()})"
        self._ready.set()  # wake waiters: they see the error
        self._replies.put({"error": self.error})

    def wait_ready(self, timeout: float) -> bool:
        """True once the template can fork; False if it failed or is not ready in time."""
        return self._ready.wait(timeout) and self.error is None

    @property
    def usable(self) -> bool:
        return self.error is None and self.proc.poll() is None

    def _call(self, msg: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if not self.usable:
                raise TemplateError(self.error or "the template process is gone")
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write((json.dumps(msg) + "\n").encode())
                self.proc.stdin.flush()
                reply = self._replies.get(timeout=self.reply_timeout_s)
            except (OSError, Empty) as e:
                raise TemplateError(f"the template process did not answer: {e}") from e
        if "error" in reply:
            raise TemplateError(reply["error"])
        return reply

    def spawn(self, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> ForkedProcess:
        reply = self._call({"op": "spawn", "argv": list(argv), "log": str(log_path), "env": dict(env or {})})
        return ForkedProcess(self, int(reply["spawned"]))

    def signal(self, pid: int, sig: int) -> bool:
        try:
            return bool(self._call({"op": "signal", "pid": pid, "sig": int(sig)}).get("ok"))
        except TemplateError:
            return False

    def exit_code(self, pid: int) -> int | None:
        code = self._exits.get(pid)
        if code is None and not self.usable and not self._reader.is_alive():
            return -signal.SIGKILL  # the template is gone: its children got SIGTERM / died with it
        return code

    def close(self) -> None:
        """Closing the pipe tells the template to SIGTERM its children and exit."""
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(serve_forever())
