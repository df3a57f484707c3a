"""The --replicas supervisor with stand-in replicas (small Python processes): a set whose
first start fails stops with that exit code; a killed replica is started again; stop()
ends every replica."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from llmserve.serve.replicas import Supervisor


def test_a_first_start_that_fails_stops_the_set_with_its_code(tmp_path):
    sup = Supervisor([sys.executable, "-c", "import sys; print('bad config'); sys.exit(3)"], 2, tmp_path, 5)
    try:
        assert sup.run() == 3
    finally:
        sup.stop()
    assert "bad config" in (tmp_path / "replica-0.log").read_text()


def test_a_killed_replica_is_started_again_and_stop_ends_all(tmp_path):
    sup = Supervisor([sys.executable, "-c", "import time; time.sleep(600)"], 2, tmp_path, 5)
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(sup.run()), daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 20
        while any(p is None for p in sup.procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        first = sup.procs[1].pid
        os.kill(first, signal.SIGKILL)  # killed, not failed: restarted even this early
        while (sup.procs[1] is None or sup.procs[1].pid == first) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sup.procs[1] is not None and sup.procs[1].pid != first
        assert sup.procs[0].poll() is None
    finally:
        sup.stop()
        t.join(10)
    assert result == [0] and all(p.poll() is not None for p in sup.procs if p is not None)
