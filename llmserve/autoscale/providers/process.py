"""Engine subprocesses: the command line, a free port, and a stop that drains.

Shared by the local provider (subprocesses of the controller) and the Ray
provider (subprocesses of an actor on a node). A child is asked to die with its
parent (Linux ``PR_SET_PDEATHSIG``), so a controller or actor killed with -9
leaves no orphaned engine holding a port and a model's memory.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - not Linux
        return None


_LIBC = _libc() if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:  # runs in the child between fork and exec: keep it minimal
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def engine_argv(engine_args: list[str] | tuple[str, ...], host: str, port: int, instance_id: str) -> list[str]:
    """The instance server's arguments for one instance (``python -m llmserve.server``)."""
    return [*engine_args, "--host", host, "--port", str(port), "--instance-id", instance_id]


def engine_command(engine_args: list[str] | tuple[str, ...], host: str, port: int,
                   instance_id: str) -> list[str]:
    return [sys.executable, "-m", "llmserve.server", *engine_argv(engine_args, host, port, instance_id)]


def foreign_command(template: tuple[str, ...], host: str, port: int, instance_id: str) -> list[str]:
    """A foreign server's argv with its placeholders filled in (plain replacement, so
    other braces in the arguments, e.g. JSON, stay as they are)."""
    fills = {"{host}": host, "{port}": str(port), "{instance_id}": instance_id}
    out = []
    for a in template:
        for k, v in fills.items():
            a = a.replace(k, v)
        out.append(a)
    return out


def spawn(cmd: list[str], log_path: Path, env: dict[str, str] | None = None,
          die_with_parent: bool = True) -> subprocess.Popen:
    """Start ``cmd`` in its own session (a Ctrl-C in the terminal reaches only the
    controller, which drains instances in order), logging to ``log_path``.
    ``die_with_parent`` False: it outlives us (replicas: the next leader adopts it)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log_path, "ab") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=full_env, start_new_session=True,
                                preexec_fn=_die_with_parent if die_with_parent else None)  # noqa: PLW1509 - only a prctl call


def terminate(proc: subprocess.Popen, grace_s: float, sleep=time.sleep) -> int | None:
    """SIGTERM (the engine drains and exits 0), then SIGKILL after ``grace_s``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while proc.poll() is None and time.monotonic() < deadline:
            sleep(0.05)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    return proc.returncode


def tail(path: Path, lines: int = 20) -> str:
    try:
        with open(path, "r", errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except OSError:
        return ""
