"""Fencing: an old leader paused with SIGSTOP past its lease and then resumed cannot
start or stop any instance; the new leader adopts what it started.

Real processes throughout: the old leader (``fenced_actor.py``), its stand-in
instance, and a password-protected redis-server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from llmserve.autoscale.providers.fenced import FencedProvider
from llmserve.autoscale.providers.local import LocalProvider, LocalProviderConfig
from llmserve.autoscale.providers.registry import ProcessRegistry, process_start
from llmserve.state.lease import Lease
from llmserve.state.redis_conn import connect

from .fenced_actor import POOL, TTL


def read_json(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    assert line, f"the old leader exited: {proc.stderr.read()[-3000:]}"
    return json.loads(line)


async def test_a_paused_leader_cannot_start_or_stop_once_resumed(redis_server, tmp_path):
    registry = tmp_path / "registry"
    old = subprocess.Popen([sys.executable, "-m", "tests.autoscale.fenced_actor", redis_server.url, str(registry),
                            str(tmp_path / "logs")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    r = await connect(redis_server.url)
    new_provider = None
    try:
        started = read_json(old)
        os.kill(old.pid, signal.SIGSTOP)
        new = Lease(r, POOL, TTL, holder="new")
        deadline = time.monotonic() + 10 * TTL.ttl_s
        while (held := await new.hold()).token is None:  # the paused one's lease runs out
            assert time.monotonic() < deadline, "the lease never expired"
            time.sleep(0.1)
        assert held.token > started["token"]
        os.kill(old.pid, signal.SIGCONT)
        old.stdin.write("go\n")
        old.stdin.flush()
        report = read_json(old)
        assert all("refused" in r for r in report["results"]), report
        assert report["refused"] == 2
        # Nothing changed: the instance it started still runs, and no second one exists.
        live = ProcessRegistry(registry).live(POOL)
        assert [e.instance_id for e in live] == ["old-1"]
        assert process_start(started["pid"]) is not None
        # The new leader adopts it from the registry and can stop it.
        new_provider = FencedProvider(LocalProvider(LocalProviderConfig(log_dir=str(tmp_path / "logs2"),
                                                                        registry_dir=str(registry))), new, POOL)
        [handle] = await new_provider.listing()
        assert handle.ref["token"] == started["token"]
        assert await new_provider.adopt(handle)
        assert ProcessRegistry(registry).live(POOL)[0].token == held.token
        await new_provider.stop(handle, 5.0)
        assert process_start(started["pid"]) is None and not ProcessRegistry(registry).live(POOL)
    finally:
        if old.poll() is None:
            os.kill(old.pid, signal.SIGCONT)
            old.kill()
            old.wait(10)
        for e in ProcessRegistry(registry).live():
            os.kill(e.pid, signal.SIGKILL)
        await r.aclose()
