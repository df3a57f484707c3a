"""A ``llmserve serve`` child process, started from a config dict, and its admin API.

Used where something must drive the real command end to end from Python: the
simulator's fidelity check (:mod:`llmserve.fidelity.live_replay`) and the live tests.
The config is written as the YAML ``llmserve serve --config`` reads, with a free
port, an admin key (generated when the config has none) and the instances' log
folder filled in, so the child is exactly what a user would run.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from llmserve.autoscale.providers.process import terminate
from llmserve.ports import free_port


class ServeProcess:
    """``llmserve serve --config`` in a child process; ``stop()`` ends it (SIGTERM: drain, then stop)."""

    def __init__(self, config: dict[str, Any], workdir: Path, *, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.workdir = Path(workdir)
        self.admin_key = config.get("admin_key") or secrets.token_urlsafe(24)
        config = {**config, "port": self.port, "admin_key": self.admin_key,
                  "provider": {"log_dir": str(self.workdir / "instances"), **config.get("provider", {})}}
        cfg_path = self.workdir / f"serve-{self.port}.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
        self.log_path = self.workdir / f"serve-{self.port}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "llmserve.cli", "serve", "--config", str(cfg_path)],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client(base_url=self.url, timeout=30, trust_env=False)

    # ---- admin --------------------------------------------------------------------------------
    def admin(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return self.client.request(method, f"/admin{path}",
                                   headers={"authorization": f"Bearer {self.admin_key}"}, **kw)

    def pool(self, key: str | None = None) -> dict:
        """The first controlled pool, or the one named ``model/version``."""
        pools = self.admin("GET", "/autoscale/pools").json()["pools"]
        return pools[0] if key is None else next(p for p in pools if p["pool"] == key)

    def pools(self) -> dict[str, dict]:
        return {p["pool"]: p for p in self.admin("GET", "/autoscale/pools").json()["pools"]}

    def canary(self, model: str) -> dict:
        return self.admin("GET", f"/models/{model}/canary").json()

    def instances(self, finished: bool = True) -> list[dict]:
        return self.admin("GET", f"/autoscale/instances?finished={str(finished).lower()}").json()["instances"]

    def events(self) -> list[dict]:
        return self.admin("GET", "/autoscale/events").json()["events"]

    def decisions(self, changes_only: bool = True) -> list[dict]:
        q = "?changes_only=true" if changes_only else ""
        return self.admin("GET", f"/autoscale/decisions{q}").json()["decisions"]

    def scale(self, instances: int | None, reason: str = "manual") -> dict:
        r = self.admin("POST", "/autoscale/scale", json={"instances": instances, "reason": reason})
        r.raise_for_status()
        return r.json()

    def metrics(self) -> str:
        return self.client.get("/metrics").text

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def instance_logs(self) -> str:
        folder = self.workdir / "instances"
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(folder.glob("*.log"))) if folder.exists() else ""

    # ---- waiting ------------------------------------------------------------------------------
    def wait_until(self, predicate: Callable[[dict], bool], timeout: float, what: str,
                   pool: str | None = None) -> dict:
        """Poll the pool (the first, or ``pool``: ``model/version``) until ``predicate(pool)``;
        raise with the logs if serve exits or time runs out."""
        deadline = time.monotonic() + timeout
        seen: dict = {}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llmserve serve exited with {self.proc.returncode}:\n{self.log()[-5000:]}")
            try:
                seen = self.pool(pool)
                if predicate(seen):
                    return seen
            except (httpx.HTTPError, KeyError, IndexError, ValueError, StopIteration):
                pass  # not listening yet
            time.sleep(0.2)
        raise TimeoutError(f"timed out waiting for {what}; pool: {seen}\n{self.log()[-5000:]}\n"
                           f"{self.instance_logs()}")

    def wait_ready(self, n: int = 1, timeout: float = 120.0, pool: str | None = None) -> dict:
        return self.wait_until(lambda p: p["counts"]["ready"] >= n, timeout, f"{n} ready instance(s)", pool)

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (serve drains and stops its instances), then SIGKILL after ``timeout``."""
        self.client.close()
        terminate(self.proc, timeout)
        return self.proc.returncode
