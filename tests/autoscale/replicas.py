"""Several ``llmserve serve`` replicas sharing one Redis and one instance registry, for
the failover test and benchmark: a pool of stand-in servers (no torch), one lease."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from llmserve.autoscale.providers.registry import ProcessRegistry

from .serve_harness import ServeProcess, standin_config

POOL = "chat/ext"
STANDIN = standin_config(1, startup_delay_s=0.5)["models"][0]["versions"][0]["command"] + " --latency 0.02"
# Steps of 0.2 every 2 s, judged on errors only (the stand-ins never fail): a rollout that
# moves while the test watches, and whose every decision shows in the history.
CANARY = {"version": "v2", "stable": "v1", "start_weight": 0.1, "step_weight": 0.2, "max_weight": 0.9,
          "interval_s": 2.0, "min_requests": 3, "failure_threshold": 3, "max_error_rate_delta": 0.3,
          "max_refusal_rate_delta": 0.3, "max_ttft_ratio": None, "max_tpot_ratio": None, "max_e2e_ratio": None,
          "min_output_ratio": None}


def canary_models() -> list[dict]:
    """``chat``: v1 stable and v2 under a canary, one stand-in instance each."""
    one = {"policy": "static", "static": {"instances": 1}, "bounds": {"min_instances": 1, "max_instances": 2}}
    return [{"name": "chat", "canary": CANARY, "versions": [
        {"name": v, "model": "upstream-name", "command": STANDIN, "autoscale": one} for v in ("v1", "v2")]}]


def replica_config(redis_url: str | None, state_dir: Path, instances: int = 2, ttl_s: float = 3.0,
                   models: list[dict] | None = None) -> dict:
    """Stand-in pool ``chat/ext`` of ``instances`` (static), the store at ``redis_url`` (None:
    ``serve --replicas`` starts its own), leases of ``ttl_s``."""
    cfg = standin_config(instances + 2, startup_delay_s=0.5)
    cfg["autoscale"] = {**cfg["autoscale"], "static": {"instances": instances},
                        "bounds": {"min_instances": instances, "max_instances": instances + 2}}
    cfg["models"][0]["versions"][0]["command"] += " --latency 0.02"
    state = {"dir": str(state_dir), **({"redis_url": redis_url} if redis_url else {})}
    cfg["gateway"] = {**cfg["gateway"], "state": state}
    cfg["leases"] = {"ttl_s": ttl_s, "renew_s": ttl_s / 3}
    if models is not None:
        cfg["models"] = models
    return cfg


def lease_of(replica: ServeProcess, pool: str = POOL) -> dict:
    return replica.pool(pool)["lease"]


def leader_among(replicas: list[ServeProcess], timeout: float = 60.0, pool: str = POOL) -> ServeProcess:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in replicas:
            try:
                if r.proc.poll() is None and lease_of(r, pool)["role"] == "leader":
                    return r
            except Exception:  # noqa: BLE001 - not listening yet
                pass
        time.sleep(0.1)
    raise TimeoutError("no replica became the leader:\n" + "\n".join(r.log()[-2000:] for r in replicas))


def live_ids(state_dir: Path, pool: str | None = POOL) -> set[str]:
    return {e.instance_id for e in ProcessRegistry(state_dir / "instances").live(pool)}


def role(p: ServeProcess, pool: str = POOL) -> str | None:
    try:
        return lease_of(p, pool)["role"] if p.proc.poll() is None else None
    except Exception:  # noqa: BLE001 - paused or gone
        return None


def start_replicas(cfg: dict, root: Path, n: int = 3) -> list[ServeProcess]:
    out = []
    for i in range(n):
        (root / f"r{i}").mkdir()
        out.append(ServeProcess(cfg, root / f"r{i}"))
    return out


def stop_replicas(procs: list[ServeProcess], state_dir: Path, pool: str = POOL) -> None:
    """Resume any paused one, stop the followers, then the leader (the last one out stops
    the instances), then kill whatever a failed test left running."""
    for p in procs:
        if p.proc.poll() is None:
            os.kill(p.proc.pid, signal.SIGCONT)
    for p in sorted(procs, key=lambda p: role(p, pool) == "leader"):
        p.stop()
    for e in ProcessRegistry(state_dir / "instances").live():
        os.kill(e.pid, signal.SIGKILL)
