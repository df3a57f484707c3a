"""Ending a child process the way every llmserve server expects: SIGTERM, then SIGKILL."""

from __future__ import annotations

import signal
import subprocess


def terminate(proc: subprocess.Popen, grace_s: float = 30.0) -> int | None:
    """SIGTERM (the server drains), SIGKILL if it is still there after ``grace_s``; its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return proc.returncode
