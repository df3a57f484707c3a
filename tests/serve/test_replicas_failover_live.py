"""Live: ``llmserve serve --replicas 3`` (real processes, its own password-protected
Redis) under steady load through its one port; the replica leading the pool is killed
with -9.

A client loses at most the one request it had on the dead replica (a reset connection);
no request another replica accepted fails. A surviving replica takes the lease and
adopts the dead leader's instances (same ids: nothing orphaned, nothing doubled); the
supervisor starts the killed replica again, as a follower. A scale-up asked through
the port reaches the new leader. Stopping serve leaves no instance behind."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tests.autoscale.replicas import POOL, live_ids, replica_config
from tests.autoscale.serve_harness import Load, ServeProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
BODY = {"model": "chat", "prompt": "hi", "max_tokens": 2}
CLIENTS = 4


def pool(s: ServeProcess) -> dict:
    """The pool as the replica a fresh connection reaches sees it (any replica may answer)."""
    with httpx.Client(base_url=s.url, timeout=10, trust_env=False) as c:
        r = c.get("/admin/autoscale/pools", headers={"authorization": f"Bearer {s.admin_key}"})
        return next(p for p in r.json()["pools"] if p["pool"] == POOL)


def leader_pid(s: ServeProcess, timeout: float = 60) -> tuple[int, int]:
    """(pid, token) of the replica leading the pool, from whichever replica answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            lease = pool(s)["lease"]
            if lease["role"] == "leader":
                return int(lease["holder"].split("/")[1]), lease["token"]
        except Exception:  # noqa: BLE001 - a replica not up yet
            pass
        time.sleep(0.1)
    raise TimeoutError(f"no leader answered:\n{s.log()[-3000:]}")


def test_kill_9_the_leading_replica_of_serve_replicas(tmp_path):
    state = tmp_path / "state"
    cfg = {**replica_config(None, state), "replicas": 3}
    s = ServeProcess(cfg, tmp_path)
    try:
        pid, token = leader_pid(s, 120)
        deadline = time.monotonic() + 90
        while len(live_ids(state)) < 2 or pool(s)["lease"]["serving"] < 2:
            assert time.monotonic() < deadline, s.log()[-3000:]
            time.sleep(0.2)
        time.sleep(2.0)  # every replica has read the pool
        before = live_ids(state)
        with Load(s.url, BODY, clients=CLIENTS, timeout_s=30) as load:
            time.sleep(1.5)
            os.kill(pid, signal.SIGKILL)
            killed_at = time.time()
            deadline = time.monotonic() + 60
            while True:
                new_pid, new_token = leader_pid(s)
                if new_pid != pid:
                    break
                assert time.monotonic() < deadline
            time.sleep(2.0)
        lost = load.failed()
        assert all(status == 0 for _, _, status in lost), lost  # no HTTP error from a survivor
        # At most the request each client had on the dead replica, and the one it sends at once
        # after: for the few ms the kernel takes to tear the killed process down, its listening
        # socket is still in the SO_REUSEPORT group, so that reconnection can land there too.
        assert len(lost) <= 2 * CLIENTS, lost
        assert all(t - killed_at < 1.0 for t, _, _ in lost), (killed_at, lost)
        assert sum(1 for t, _, st in load.results if t > killed_at and st == 200) > 0
        assert new_token > token
        assert live_ids(state) == before  # adopted: nothing orphaned, nothing doubled
        r = s.admin("POST", "/autoscale/scale", json={"instances": 3, "reason": "test: after failover"})
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 60
        while len(live_ids(state)) < 3:
            assert time.monotonic() < deadline, s.log()[-3000:]
            time.sleep(0.2)
        assert before < live_ids(state)
        assert all(f"t{new_token}-" in i for i in live_ids(state) - before)
    finally:
        code = s.stop(90)
    assert code == 0, s.log()[-3000:]
    assert live_ids(state, None) == set()  # the last replica out stopped every instance
