"""What sharing gateway state through Redis costs and how fast it moves (issue 32).

Real processes: two ``llmserve gateway --config`` replicas on one password-protected
``redis-server`` (``tests/redis_server.py``), one fake upstream per version
(``tests/gateway/fake_upstream.py``, in this process's threads), and the same config
without ``state.redis_url`` for the baseline.

1. Propagation: an admin action (pause / resume) on replica A, then B's admin API polled
   every 5 ms until it shows it; ``--actions`` times; p50 / p95 / max in ms.
2. Request path: closed-loop clients (``--concurrency``) for ``--seconds`` against one
   gateway with the shared state and one without, alternated over ``--rounds``;
   requests/s of each and the ratio (the request path reads nothing from the store).
3. Outage: Redis killed (kill -9): seconds until A's ``/ready`` says ``frozen``; Redis
   started again: seconds until it says ``live``.

    python benchmarks/replicas/shared_state.py [--rounds 3] [--seconds 5] [--concurrency 16]

Results: ``benchmarks/results/replicas_shared_state.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from llmserve.percentiles import percentile  # noqa: E402
from tests.gateway.fake_upstream import Behaviour, ServerThread, make_app  # noqa: E402
from tests.gateway.test_gateway_engines import GatewayProcess, gateway_config  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402

CANARY = {"version": "canary", "stable": "v1", "start_weight": 0.2, "interval_s": 3600}


def _wait(cond, timeout: float = 30.0, step: float = 0.005) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError
        time.sleep(step)
    return time.monotonic() - t0


def propagation(a: GatewayProcess, b: GatewayProcess, n: int) -> list[float]:
    out = []
    for i in range(n):
        action, state = ("pause", "paused") if i % 2 == 0 else ("resume", "progressing")
        assert a.admin("POST", f"/models/tiny/canary/{action}").status_code == 200
        t0 = time.monotonic()
        _wait(lambda: b.admin("GET", "/models/tiny/canary").json()["state"] == state)
        out.append(1000 * (time.monotonic() - t0))
    return out


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def throughput(gw: GatewayProcess, seconds: float, concurrency: int) -> tuple[float, float]:
    """Requests/s, and the gateway's CPU milliseconds per request (steadier on a shared machine)."""
    done = [0]
    cpu0 = cpu_s(gw.proc.pid)
    stop = time.monotonic() + seconds
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(base_url=gw.url, timeout=30) as c:
            while time.monotonic() < stop:
                r = c.post("/v1/chat/completions", json={"model": "tiny", "max_tokens": 2,
                                                         "messages": [{"role": "user", "content": "hi"}]})
                if r.status_code == 200:
                    with lock:
                        done[0] += 1
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0] / seconds, 1000 * (cpu_s(gw.proc.pid) - cpu0) / max(1, done[0])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--actions", type=int, default=20)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="replicas-bench-"))
    redis = RedisServer(tmp / "redis").start()
    ups = {v: ServerThread(make_app(Behaviour(v, tokens=2))).start() for v in ("v1", "canary")}
    base = gateway_config({v: [s.url] for v, s in ups.items()}, weights={"v1": 1, "canary": 0}, canary=CANARY)
    shared_cfg = {**base, "state": {"dir": str(tmp / "state"), "redis_url": redis.url}}
    alone_cfg = {**base, "state": {"dir": str(tmp / "alone")}}
    a, b = GatewayProcess(shared_cfg, tmp), GatewayProcess(shared_cfg, tmp)
    alone = GatewayProcess(alone_cfg, tmp)
    try:
        for gw in (a, b, alone):
            gw.wait_all_ready()
        prop = propagation(a, b, args.actions)
        rounds = []
        for i in range(args.rounds):
            order = [("shared", a), ("alone", alone)] if i % 2 == 0 else [("alone", alone), ("shared", a)]
            rounds.append({name: dict(zip(("rps", "cpu_ms"), throughput(gw, args.seconds, args.concurrency)))
                           for name, gw in order})
        redis.stop()
        frozen_s = _wait(lambda: a.client.get("/ready").json().get("shared_state", {}).get("rollouts") == "frozen",
                         step=0.01)
        redis.start()
        live_s = _wait(lambda: a.client.get("/ready").json()["shared_state"]["rollouts"] == "live", step=0.01)
    finally:
        for gw in (a, b, alone):
            gw.stop()
        for s in ups.values():
            s.stop(force=True)
        redis.stop()
    ratios = sorted(r["shared"]["rps"] / r["alone"]["rps"] for r in rounds)
    cpu = sorted(r["shared"]["cpu_ms"] / r["alone"]["cpu_ms"] for r in rounds)
    result = {"propagation_ms": {"p50": percentile(prop, 50), "p95": percentile(prop, 95), "max": max(prop)},
              "rounds": rounds, "throughput_ratio_median": ratios[len(ratios) // 2],
              "cpu_per_request_ratio_median": cpu[len(cpu) // 2],
              "outage_detected_s": frozen_s, "resumed_s": live_s, "args": vars(args)}
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / "replicas_shared_state.json").write_text(json.dumps(result, indent=2))
    lines = ["# Gateway replicas: shared state through Redis", "",
             "`python benchmarks/replicas/shared_state.py " + " ".join(sys.argv[1:]) + "`"
             " (2 shared cores, other agents running: compare within the run)", "",
             f"- admin action on replica A seen on replica B: p50 {result['propagation_ms']['p50']:.0f} ms, "
             f"p95 {result['propagation_ms']['p95']:.0f} ms, max {result['propagation_ms']['max']:.0f} ms "
             f"({args.actions} actions; replicas poll every 0.5 s, a GET refreshes first)",
             f"- requests/s with the shared state / without, c={args.concurrency}, median of {args.rounds} "
             f"alternated rounds: {result['throughput_ratio_median']:.3f} "
             f"({'; '.join('%.0f vs %.0f' % (r['shared']['rps'], r['alone']['rps']) for r in rounds)})",
             f"- gateway CPU per request, shared / without, median: {result['cpu_per_request_ratio_median']:.3f} "
             f"({'; '.join('%.2f vs %.2f ms' % (r['shared']['cpu_ms'], r['alone']['cpu_ms']) for r in rounds)})",
             f"- Redis killed: rollouts frozen on A after {frozen_s:.2f} s; Redis back: live after {live_s:.2f} s", ""]
    (out / "replicas_shared_state.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
