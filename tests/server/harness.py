"""Start real ``llmserve engine`` processes for tests (and for other layers' tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from llmserve.ports import free_port


BIND_RETRIES = 3  # another process can still take the port between our pick and the bind


@dataclass
class EngineProcess:
    proc: subprocess.Popen
    port: int
    log_path: Path
    args: tuple[str, ...] = ()  # the engine's arguments less --port, to start it again
    rebind: bool = False  # the port was ours to choose: a taken one is chosen again

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def launch(self) -> None:
        self.log_path = self.log_path.with_name(f"engine-{self.port}.log")
        cmd = [sys.executable, "-m", "llmserve.cli", "engine", *self.args, "--port", str(self.port)]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        retries = BIND_RETRIES
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if retries and self.rebind and "address already in use" in self.log().lower():
                    retries -= 1
                    self.port = free_port()
                    self.launch()
                    continue
                raise RuntimeError(f"engine exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/ready", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"engine not ready after {timeout}s:\n{self.log()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)


def start_engine(model: Path | str, tmp_path: Path, *args: str, wait: bool = True,
                 port: int | None = None) -> EngineProcess:
    """An engine on ``port`` (a free one if not given; chosen again if taken before it binds,
    so read ``url`` after ``wait_ready``)."""
    ep = EngineProcess(None, port or free_port(), Path(tmp_path) / "engine.log",  # type: ignore[arg-type]
                       ("--model", str(model), "--threads", "1", *args), rebind=port is None)
    ep.launch()
    if wait:
        ep.wait_ready()
    return ep


def post(ep: EngineProcess, path: str, body: dict, timeout: float = 60) -> httpx.Response:
    """POST ``body`` as JSON to ``path`` on the engine."""
    return httpx.post(ep.url + path, json=body, timeout=timeout)
