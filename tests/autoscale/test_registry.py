"""The local provider's registry: what a new leader adopts from, never a reused pid."""

from __future__ import annotations

import os
import subprocess
import sys

from llmserve.autoscale.providers.registry import AdoptedProcess, ProcessRegistry, Registered, process_start


def entry(pid: int, started: int | None, iid: str = "v1-t1-1", pool: str = "chat/v1") -> Registered:
    return Registered(iid, pool, pid, started or 0, 1234, "http://127.0.0.1:1234", "/dev/null", 1)


def test_a_live_process_is_listed_and_a_reused_pid_is_not(tmp_path):
    reg = ProcessRegistry(tmp_path)
    me = os.getpid()
    reg.record(entry(me, process_start(me)))
    reg.record(entry(me, process_start(me) - 1, "v1-t1-2"))  # same pid, another start time: not ours
    reg.record(entry(me, process_start(me), "v2-t1-1", pool="chat/v2"))
    assert [e.instance_id for e in reg.live("chat/v1")] == ["v1-t1-1"]
    assert [e.instance_id for e in reg.entries("chat/v1")] == ["v1-t1-1"]  # the stale one was removed
    (tmp_path / "junk.json").write_text("{not json")
    assert len(reg.entries()) == 2  # an unreadable file is skipped, never trusted


def test_an_adopted_process_is_watched_and_stopped_by_pid(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        adopted = AdoptedProcess(entry(proc.pid, process_start(proc.pid)))
        assert adopted.poll() is None
        adopted.send_signal(15)
        proc.wait(10)  # reaped here, as init reaps an orphan
        assert adopted.poll() is not None
    finally:
        proc.kill()
        proc.wait()
