"""Leader failover: how long scaling pauses when the leading replica is killed with -9.

Three ``llmserve serve`` replicas on one password-protected redis-server, a pool of two
stand-in instances (no torch), steady load on the two followers. The leader is killed
with SIGKILL; the figure is the time from the kill to the new leader's first tick
(``lease.resumed_at``: its first scaling decision), against the bound the issue sets,
the lease TTL plus one tick. Also recorded: requests the followers failed (should be
0) and the instance ids before and after (adopted: the same).

    PYTHONPATH=. python benchmarks/ha/failover.py --ttl 3 6 --runs 2 --out benchmarks/ha/failover.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from tests.autoscale.replicas import (POOL, leader_among, lease_of, live_ids, replica_config, start_replicas,
                                      stop_replicas)
from tests.autoscale.serve_harness import Load
from tests.redis_server import RedisServer

BODY = {"model": "chat", "prompt": "hi", "max_tokens": 2}
TICK_S = 0.5  # replica_config's autoscale.tick_s


def one_run(ttl_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="llmserve-failover-") as tmp:
        root = Path(tmp)
        redis = RedisServer(root / "redis").start()
        state = root / "state"
        procs = start_replicas(replica_config(redis.url, state, ttl_s=ttl_s), root)
        try:
            leader = leader_among(procs, 120)
            leader.wait_ready(2, 120, POOL)
            before = live_ids(state)
            followers = [p for p in procs if p is not leader]
            time.sleep(ttl_s)  # followers have the view; a renewal has happened
            loads = [Load(f.url, BODY, clients=2, timeout_s=30).__enter__() for f in followers]
            time.sleep(2.0)
            leader.proc.kill()
            killed_at = time.time()
            leader.proc.wait(10)
            new = leader_among(followers, 120)
            while lease_of(new)["resumed_at"] is None:
                time.sleep(0.05)
            lease = lease_of(new)
            new.wait_ready(2, 60, POOL)
            time.sleep(1.0)
            for load in loads:
                load.__exit__(None, None, None)
            results = [r for load in loads for r in load.results]
            return {"ttl_s": ttl_s, "tick_s": TICK_S, "bound_s": ttl_s + TICK_S,
                    "lease_taken_after_s": round(lease["took_over_at"] - killed_at, 3),
                    "scaling_resumed_after_s": round(lease["resumed_at"] - killed_at, 3),
                    "requests": len(results), "requests_during_failover": sum(1 for r in results if r[0] > killed_at),
                    "failed": sum(1 for load in loads for _ in load.failed()),
                    "instances_before": sorted(before), "instances_after": sorted(live_ids(state))}
        finally:
            stop_replicas(procs, state)
            redis.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ttl", type=float, nargs="+", default=[3.0, 6.0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    runs = []
    for ttl in a.ttl:
        for _ in range(a.runs):
            r = one_run(ttl)
            print(json.dumps(r), flush=True)
            runs.append(r)
    if a.out:
        Path(a.out).write_text(json.dumps({"runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
