"""Live: a canary rollout across three ``llmserve serve`` replicas survives a kill -9 of
its leader: the rollout goes on from its stage on the new leader (never back to the
start, no step taken twice), every replica routes by the same weights, and no request
a surviving replica accepted fails.

The canary's decisions are the leader's of the canary version's pool
(``serve/leases.py``); the rollout itself lives in the shared store (``state/rollouts.py``).
"""

from __future__ import annotations

import time

import pytest

from .replicas import canary_models, leader_among, replica_config, start_replicas, stop_replicas
from .serve_harness import Load

pytestmark = pytest.mark.timeout(300)
CANARY_POOL = "chat/v2"
BODY = {"model": "chat", "prompt": "hi", "max_tokens": 2}


def history(p) -> list[dict]:
    return p.admin("GET", "/models/chat/canary/history").json()["events"]


def wait(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    raise TimeoutError(what)


def test_the_canary_goes_on_from_its_stage_after_the_leader_dies(redis_server, tmp_path):
    state = tmp_path / "state"
    procs = start_replicas(replica_config(redis_server.url, state, models=canary_models()), tmp_path)
    try:
        leader = leader_among(procs, pool=CANARY_POOL)
        for pool in ("chat/v1", CANARY_POOL):
            leader_among(procs, pool=pool).wait_ready(1, 90, pool)
        followers = [p for p in procs if p is not leader]
        # Traffic on every replica, as an L4 balancer spreads it: the leader judges the
        # canary on what it serves itself.
        to_leader = Load(leader.url, BODY, clients=1, timeout_s=30).__enter__()
        loads = [Load(f.url, BODY, clients=2, timeout_s=30) for f in followers]
        for load in loads:
            load.__enter__()
        try:
            wait(lambda: leader.canary("chat")["weight"] >= 0.3, 90, "the canary's second step")
            stage = leader.canary("chat")["weight"]
            leader.proc.kill()
            leader.proc.wait(10)
            to_leader.__exit__(None, None, None)  # the balancer stops sending it traffic
            new = leader_among(followers, pool=CANARY_POOL)
            seen = [f.canary("chat")["weight"] for f in followers]
            assert min(seen) >= stage  # nobody went back to the start
            wait(lambda: new.canary("chat")["state"] == "promoted", 120, "the promotion, on the new leader")
        finally:
            for load in loads:
                load.__exit__(None, None, None)
        assert [r for load in loads for r in load.failed()] == []  # every survivor's request succeeded
        events = history(new)
        assert [e["action"] for e in events].count("start") == 1
        steps = [e["weight"] for e in events if e["action"] == "advance"]
        assert steps == sorted(set(steps))  # each step once: one decision per stage, by one leader
        assert steps[0] <= stage < steps[-1]  # steps taken before the failover and after it
        wait(lambda: all(f.canary("chat")["state"] == "promoted" for f in followers), 10, "every replica")
    finally:
        stop_replicas(procs, state, CANARY_POOL)
