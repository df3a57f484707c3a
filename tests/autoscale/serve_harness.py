"""Run a real ``llmserve serve`` process for tests (and the live benchmark script).

:class:`ServeProcess` starts it from a config dict, talks to its admin API, and
can run a :class:`Sampler` thread that records every instance's state, pool
membership and served count a few times a second, so a test can check what
happened *during* a run (a warming instance was never in the pool) and not only
what the end looks like.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from llmserve.autoscale.collector import percentile as collector_percentile
from tests.server.harness import free_port

ADMIN = "admin-key-for-serve-tests-0123456789"
FAST_GATEWAY = {"polling": {"load_interval_s": 0.1, "ready_interval_s": 0.5, "timeout_s": 2.0}}


def serve_config(model: Path | str, **over) -> dict:
    """A compressed-time config: tiny model, one CPU thread per instance, fast ticks."""
    cfg = {"model": str(model), "served_model_name": "tiny", "admin_key": ADMIN, "threads_per_instance": 1,
           "engine_args": ["--max-num-seqs", "4"], "log_level": "info", "gateway": FAST_GATEWAY,
           "lifecycle": {"probe_interval_s": 0.2, "stop_grace_s": 20.0, "drain_timeout_s": 30.0},
           "autoscale": {"tick_s": 0.5}}
    for k, v in over.items():
        cfg[k] = {**cfg[k], **v} if isinstance(v, dict) and isinstance(cfg.get(k), dict) else v
    return cfg


class ServeProcess:
    def __init__(self, config: dict, tmp_path: Path, *, env: dict | None = None) -> None:
        self.port = free_port()
        self.tmp_path = Path(tmp_path)
        config = {**config, "port": self.port,
                  "provider": {"log_dir": str(self.tmp_path / "instances"), **config.get("provider", {})}}
        self.config = config
        cfg_path = self.tmp_path / f"serve-{self.port}.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
        self.log_path = self.tmp_path / f"serve-{self.port}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "llmserve.cli", "serve", "--config", str(cfg_path)],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client(base_url=self.url, timeout=30)

    # ---- admin --------------------------------------------------------------------------------
    def admin(self, method: str, path: str, **kw) -> httpx.Response:
        return self.client.request(method, f"/admin{path}", headers={"authorization": f"Bearer {ADMIN}"}, **kw)

    def pool(self) -> dict:
        return self.admin("GET", "/autoscale/pools").json()["pools"][0]

    def instances(self, finished: bool = True) -> list[dict]:
        return self.admin("GET", f"/autoscale/instances?finished={str(finished).lower()}").json()["instances"]

    def events(self) -> list[dict]:
        return self.admin("GET", "/autoscale/events").json()["events"]

    def decisions(self, changes_only: bool = True) -> list[dict]:
        q = "?changes_only=true" if changes_only else ""
        return self.admin("GET", f"/autoscale/decisions{q}").json()["decisions"]

    def scale(self, instances: int | None, reason: str = "test") -> dict:
        r = self.admin("POST", "/autoscale/scale", json={"instances": instances, "reason": reason})
        r.raise_for_status()
        return r.json()

    def metrics(self) -> str:
        return self.client.get("/metrics").text

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def instance_logs(self) -> str:
        folder = self.tmp_path / "instances"
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(folder.glob("*.log"))) if folder.exists() else ""

    # ---- waiting ------------------------------------------------------------------------------
    def wait_until(self, predicate: Callable[[dict], bool], timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        pool: dict = {}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llmserve serve exited with {self.proc.returncode}:\n{self.log()[-5000:]}")
            try:
                pool = self.pool()
                if predicate(pool):
                    return pool
            except (httpx.HTTPError, KeyError, IndexError, ValueError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"timed out waiting for {what}; pool: {pool}\n{self.log()[-5000:]}\n"
                           f"{self.instance_logs()}")

    def wait_ready(self, n: int = 1, timeout: float = 120.0) -> dict:
        return self.wait_until(lambda p: p["counts"]["ready"] >= n, timeout, f"{n} ready instance(s)")

    def stop(self, timeout: float = 60.0) -> int | None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


@dataclass
class Sample:
    time: float
    instances: list[dict]


@dataclass
class Sampler:
    """Polls ``/admin/autoscale/instances`` every ``interval_s`` in a thread."""

    serve: ServeProcess
    interval_s: float = 0.25
    samples: list[Sample] = field(default_factory=list)
    errors: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.serve.url, timeout=10,
                          headers={"authorization": f"Bearer {ADMIN}"}) as client:
            while not self._stop.is_set():
                try:
                    r = client.get("/admin/autoscale/instances?finished=false")
                    self.samples.append(Sample(time.time(), r.json()["instances"]))
                except (httpx.HTTPError, ValueError, KeyError):
                    self.errors += 1
                self._stop.wait(self.interval_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def first_traffic(self) -> dict[str, float]:
        """When each instance was first seen with a served request."""
        out: dict[str, float] = {}
        for s in self.samples:
            for i in s.instances:
                if i["served"] > 0 and i["instance_id"] not in out:
                    out[i["instance_id"]] = s.time
        return out

    def violations(self) -> list[str]:
        """Any sample where a not-ready instance was in the pool or had served a request."""
        bad = []
        for s in self.samples:
            for i in s.instances:
                if i["state"] in ("starting", "warming") and (i["in_pool"] or i["served"] > 0):
                    bad.append(f"{s.time:.2f} {i['instance_id']} {i['state']} in_pool={i['in_pool']} "
                               f"served={i['served']}")
        return bad


# ---- figures of a run ---------------------------------------------------------------------------
def instance_seconds(events: list[dict], t0: float, t1: float) -> float:
    """Instance-seconds held (starting until stopped or failed) within [t0, t1], from events."""
    spans: dict[str, list[float]] = {}
    for e in events:
        if e["kind"] != "transition":
            continue
        if e["old"] is None:
            spans[e["instance_id"]] = [e["time"], t1]
        elif e["new"] in ("stopped", "failed") and e["instance_id"] in spans:
            spans[e["instance_id"]][1] = e["time"]
    return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in spans.values())


def peak_ready(samples: list[Sample]) -> int:
    return max((sum(1 for i in s.instances if i["state"] == "ready") for s in samples), default=0)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest rank, as the controller's signals compute it."""
    return collector_percentile(sorted(values), q)
