"""terminate(): SIGTERM first, SIGKILL only for a child that outlives its grace period."""

from __future__ import annotations

import signal
import subprocess
import sys

from llmserve.autoscale.providers.process import terminate


def _child(code: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"up\n"  # handlers are installed
    return p


def test_sigterm_ends_a_cooperative_child():
    p = _child("import signal, sys, time\n"
               "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
               "print('up', flush=True); time.sleep(60)")
    assert terminate(p, grace_s=10) == 0


def test_a_child_ignoring_sigterm_is_killed_after_the_grace():
    p = _child("import signal, time\n"
               "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
               "print('up', flush=True); time.sleep(60)")
    assert terminate(p, grace_s=0.5) == -signal.SIGKILL
    assert terminate(p, grace_s=0.5) == -signal.SIGKILL  # already gone: no signal, same code
