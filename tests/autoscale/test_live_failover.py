"""Live: three ``llmserve serve`` replicas, one Redis, stand-in instances under steady
load; the leader is killed with -9.

No request the other replicas accepted fails; a follower takes the lease and ticks in
the same step it takes it (so scaling resumes within the TTL plus one tick; the time
is recorded by benchmarks/ha/failover.py, not asserted); it adopts the instances the
dead leader started (same ids: nothing orphaned, nothing doubled) and scales them.
The scale-up after it is asked of a follower: the override is shared. Then a leader paused with SIGSTOP past its lease and resumed changes nothing.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from .replicas import POOL, leader_among, lease_of, live_ids, replica_config, role, start_replicas, stop_replicas
from .serve_harness import Load, ServeProcess

pytestmark = pytest.mark.timeout(300)
BODY = {"model": "chat", "prompt": "hi", "max_tokens": 2}


@pytest.fixture
def replicas(redis_server, tmp_path):
    state = tmp_path / "state"
    procs = start_replicas(replica_config(redis_server.url, state), tmp_path)
    try:
        yield procs, state
    finally:
        stop_replicas(procs, state)


def serving_everywhere(procs: list[ServeProcess], n: int, timeout: float = 60.0) -> None:
    """Every replica's pool has the leader's ``n`` instances (followers: from its published view)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if all(lease_of(p)["serving"] == n for p in procs):
                return
        except (KeyError, ValueError):  # a replica still starting
            pass
        time.sleep(0.2)
    raise TimeoutError(f"not every replica serves {n}: {[lease_of(p) for p in procs]}")


def test_kill_9_the_leader_under_load(replicas):
    procs, state = replicas
    leader = leader_among(procs)
    leader.wait_ready(2, 90, POOL)
    serving_everywhere(procs, 2)
    old_token = lease_of(leader)["token"]
    before = live_ids(state)
    assert len(before) == 2
    followers = [p for p in procs if p is not leader]
    loads = [Load(f.url, BODY, clients=2, timeout_s=30) for f in followers]
    for load in loads:
        load.__enter__()
    try:
        time.sleep(1.5)
        leader.proc.kill()
        leader.proc.wait(10)
        killed_at = time.time()
        new = leader_among(followers)
        new.wait_ready(2, 60, POOL)
        time.sleep(1.0)
    finally:
        for load in loads:
            load.__exit__(None, None, None)
    results = [r for load in loads for r in load.results]
    assert sum(1 for r in results if r[0] > killed_at) > 0, "no load ran through the failover"
    assert [r for load in loads for r in load.failed()] == []  # no accepted request failed
    lease = lease_of(new)
    assert lease["takeovers"] == 1 and lease["token"] > old_token
    assert lease["steps_to_resume"] == 0  # it ticked in the step that took the lease
    # Nothing orphaned, nothing doubled: the very instances the dead leader started, adopted.
    assert live_ids(state) == before
    assert {i["instance_id"] for i in new.instances(finished=False)} == before
    assert all(i["state"] == "ready" for i in new.instances(finished=False))
    # Scaling resumed on the new leader: asked on the other follower's admin API (the
    # override is shared), it starts a third instance, under its own token.
    other = next(f for f in followers if f is not new)
    other.scale(3, "test: up after failover, asked of a follower")
    new.wait_ready(3, 60, POOL)
    after = live_ids(state)
    assert len(after) == 3 and before < after
    assert [i for i in after - before if f"t{lease['token']}-" not in i] == []
    serving_everywhere([p for p in followers], 3)


def test_a_leader_paused_past_its_lease_changes_nothing_when_resumed(replicas):
    procs, state = replicas
    leader = leader_among(procs)
    leader.wait_ready(2, 90, POOL)
    serving_everywhere(procs, 2)
    before = live_ids(state)
    leader.scale(3, "test: asked just before the pause")  # what it would do on waking
    os.kill(leader.proc.pid, signal.SIGSTOP)
    others = [p for p in procs if p is not leader]
    new = leader_among(others)
    new.wait_ready(2, 60, POOL)
    os.kill(leader.proc.pid, signal.SIGCONT)
    deadline = time.monotonic() + 30
    while role(leader) != "follower":
        assert time.monotonic() < deadline, leader.log()[-3000:]
        time.sleep(0.2)
    time.sleep(2.0)  # time for any late action of the resumed one to show
    lease = lease_of(leader)
    assert lease["role"] == "follower" and lease_of(new)["role"] == "leader"
    # Whatever the paused one had under way: at most its third instance, which the new leader
    # now owns or stopped; never a stop of the instances the new leader adopted.
    after = live_ids(state)
    assert before <= after
    assert after == {i["instance_id"] for i in new.instances(finished=False)}
    assert sum(1 for p in procs if role(p) == "leader") == 1


def test_the_leader_sees_the_traffic_its_followers_serve(redis_server, tmp_path):
    """Requests only through a follower: the leader's signals (what it scales on) still
    show their arrivals and latencies, forwarded through the store."""
    state = tmp_path / "state"
    procs = start_replicas(replica_config(redis_server.url, state, instances=1), tmp_path, n=2)
    try:
        leader = leader_among(procs)
        leader.wait_ready(1, 90, POOL)
        serving_everywhere(procs, 1)
        follower = next(p for p in procs if p is not leader)

        def seen() -> dict:  # the leader's latest sample ({} before its first tick has one)
            samples = leader.admin("GET", f"/autoscale/timeline?pool={POOL}").json()["samples"]
            return samples[-1] if samples else {}
        deadline = time.monotonic() + 30
        while not seen():
            assert time.monotonic() < deadline, "the leader's timeline has no sample"
            time.sleep(0.2)
        assert not seen().get("arrival_rate")  # nothing so far (0, or not measured yet)
        with Load(follower.url, BODY, clients=2, timeout_s=30) as load:
            deadline = time.monotonic() + 30
            while not seen().get("arrival_rate") or seen().get("e2e_p50") is None:
                assert time.monotonic() < deadline, seen()
                time.sleep(0.3)
        assert load.results and not load.failed()
        assert leader.pool(POOL)["lease"]["role"] == "leader"
    finally:
        stop_replicas(procs, state)


def test_an_orphan_no_leader_holds_is_stopped(replicas):
    """An instance in the pool's listing that no leader's book holds (a start a stale leader
    made as it lost the lease) is stopped by the leader's sweep; the others are kept."""
    import subprocess
    import sys

    from llmserve.autoscale.providers.registry import ProcessRegistry, Registered, process_start
    from llmserve.ports import free_port

    procs, state = replicas
    leader = leader_among(procs)
    leader.wait_ready(2, 90, POOL)
    before = live_ids(state)
    port = free_port()
    orphan = subprocess.Popen([sys.executable, "-m", "tests.autoscale.standin_server", "--port", str(port),
                               "--model", "upstream-name"], start_new_session=True)
    try:
        ProcessRegistry(state / "instances").record(Registered(
            "ext-t0-9", POOL, orphan.pid, process_start(orphan.pid), port, f"http://127.0.0.1:{port}", "", 0))
        orphan.wait(30)  # stopped by the leader, SIGTERM first (uvicorn exits gracefully)
        assert orphan.returncode in (0, -15)
        assert live_ids(state) == before  # nothing else touched
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()
