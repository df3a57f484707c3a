"""Run a real ``llmserve serve`` process for tests (and the live benchmark script).

:class:`~llmserve.serve.serve_process.ServeProcess` (in the package: the
simulator's fidelity check uses it too) starts it from a config dict and talks to
its admin API; here are a compressed-time config for tests and a :class:`Sampler`
thread that records every instance's state, pool membership and served count a
few times a second, so a test can check what happened *during* a run (a warming
instance was never in the pool) and not only what the end looks like.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from llmserve.percentiles import percentile
from llmserve.serve.serve_process import ServeProcess

__all__ = ["ADMIN", "FAST_GATEWAY", "Load", "Sample", "Sampler", "ServeProcess", "peak_ready", "percentile",
           "serve_config", "standin_config"]

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


def standin_config(max_instances: int, startup_delay_s: float = 0.0) -> dict:
    """Model ``chat``: one static instance of the foreign stand-in server (no torch, cheap),
    scalable to ``max_instances``."""
    cfg = serve_config("unused", autoscale={"policy": "static", "static": {"instances": 1}, "tick_s": 0.5,
                                            "bounds": {"min_instances": 1, "max_instances": max_instances}})
    for k in ("model", "served_model_name", "engine_args", "threads_per_instance"):
        cfg.pop(k)
    delay = f" --startup-delay {startup_delay_s}" if startup_delay_s else ""
    cfg["models"] = [{"name": "chat", "versions": [{
        "name": "ext", "model": "upstream-name",
        "command": f"{sys.executable} -m tests.autoscale.standin_server --host {{host}} --port {{port}} "
                   "--model {model}" + delay}]}]
    return cfg


@dataclass
class Load:
    """Closed-loop clients sending ``body`` back to back until stopped; each answer kept
    as (time, the version that served it, status), status 0 for a transport error."""

    url: str
    body: dict
    clients: int = 2
    timeout_s: float = 60.0
    results: list[tuple[float, str | None, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(self.clients)]

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=self.timeout_s, trust_env=False) as c:
            while not self._stop.is_set():
                try:
                    r = c.post("/v1/completions", json=self.body)
                    self.results.append((time.time(), r.headers.get("x-llmserve-version"), r.status_code))
                except httpx.HTTPError:
                    self.results.append((time.time(), None, 0))

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.timeout_s + 10)

    def failed(self, version: str | None = None) -> list[tuple[float, str | None, int]]:
        return [r for r in self.results if (version is None or r[1] == version) and r[2] != 200]


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
                          headers={"authorization": f"Bearer {self.serve.admin_key}"}) as client:
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


def settled_at(n: int):
    """A pool predicate: ``n`` instances provisioned and none draining or stopping."""
    return lambda p: p["provisioned"] == n and p["counts"]["draining"] == p["counts"]["stopping"] == 0


# ---- figures of a run ---------------------------------------------------------------------------
def peak_ready(samples: list[Sample]) -> int:
    return max((sum(1 for i in s.instances if i["state"] == "ready") for s in samples), default=0)
