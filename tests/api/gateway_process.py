"""A real ``llmserve gateway`` process over given upstreams, with its own state folder."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from tests.server.harness import free_port


class GatewayProcess:
    def __init__(self, folder: Path, upstreams: list[str], *, keys: list[str] | None = None,
                 batches: dict | None = None, state: dict | None = None) -> None:
        self.folder, self.port = folder, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = {
            "models": [{"name": "tiny", "versions": [{"name": "v1", "weight": 1.0, "upstreams": upstreams}]}],
            "auth": {"api_keys": keys or []},
            "polling": {"load_interval_s": 0.1, "ready_interval_s": 0.2, "timeout_s": 1.0},
            "state": {"dir": str(folder / "state"), **(state or {})},
            "batches": {"poll_interval_s": 0.1, "retry_interval_s": 0.2, **(batches or {})}}
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        cfg = self.folder / "gateway.yaml"
        cfg.write_text(yaml.safe_dump(self.config))
        self.starts += 1
        log = open(self.folder / f"gateway-{self.starts}.log", "wb")  # noqa: SIM115 - the process holds it
        self.proc = subprocess.Popen([sys.executable, "-m", "llmserve.cli", "gateway", "--config", str(cfg),
                                      "--port", str(self.port), "--log-level", "warning"],
                                     stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited:\n{self.log()}")
            try:
                if httpx.get(self.url + "/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"gateway not ready:\n{self.log()}")

    def log(self) -> str:
        return (self.folder / f"gateway-{self.starts}.log").read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
