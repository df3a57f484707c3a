"""Several ``llmserve serve`` replicas sharing one Redis and one instance registry, for
the failover test and benchmark: a pool of stand-in servers (no torch), one lease."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from llmserve.autoscale.providers.registry import ProcessRegistry

from .serve_harness import ServeProcess, serve_config

POOL = "chat/ext"


def replica_config(redis_url: str, state_dir: Path, instances: int = 2, ttl_s: float = 3.0) -> dict:
    cfg = serve_config("unused", autoscale={"policy": "static", "static": {"instances": instances}, "tick_s": 0.5,
                                            "bounds": {"min_instances": instances, "max_instances": instances + 2}})
    for k in ("model", "served_model_name", "engine_args", "threads_per_instance"):
        cfg.pop(k)
    cfg["gateway"] = {**cfg["gateway"], "state": {"dir": str(state_dir), "redis_url": redis_url}}
    cfg["leases"] = {"ttl_s": ttl_s, "renew_s": ttl_s / 3}
    cfg["models"] = [{"name": "chat", "versions": [{
        "name": "ext", "model": "upstream-name",
        "command": f"{sys.executable} -m tests.autoscale.standin_server --host {{host}} --port {{port}} "
                   "--model {model} --startup-delay 0.5 --latency 0.02"}]}]
    return cfg


def lease_of(replica: ServeProcess) -> dict:
    return replica.pool(POOL)["lease"]


def leader_among(replicas: list[ServeProcess], timeout: float = 60.0) -> ServeProcess:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in replicas:
            try:
                if r.proc.poll() is None and lease_of(r)["role"] == "leader":
                    return r
            except Exception:  # noqa: BLE001 - not listening yet
                pass
        time.sleep(0.1)
    raise TimeoutError("no replica became the leader:\n" + "\n".join(r.log()[-2000:] for r in replicas))


def live_ids(state_dir: Path) -> set[str]:
    return {e.instance_id for e in ProcessRegistry(state_dir / "instances").live(POOL)}
