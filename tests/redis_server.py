"""A real ``redis-server`` for tests: its own port, its own directory, a password.

The store is a privilege boundary, so the tests' Redis is never open: every client
must authenticate (``redis://:PASSWORD@127.0.0.1:PORT/0``). ``stop()`` is a kill -9
and ``start()`` brings the same server back on the same port, for outage tests.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from llmserve.ports import free_port


def redis_binary() -> str:
    """The redis-server binary, or skip/fail as the browser tests do."""
    found = shutil.which("redis-server")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("no redis-server binary although scripts/setup.sh test installs it")
    pytest.skip("no redis-server binary (scripts/setup.sh test installs it)")


class RedisServer:
    def __init__(self, workdir: Path, password: str | None = None) -> None:
        self.binary = redis_binary()
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.password = password or secrets.token_hex(16)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    @property
    def url_without_password(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--requirepass", self.password, "--dir", str(self.workdir),
                "--save", "", "--appendonly", "no", "--protected-mode", "yes"]
        log = open(self.workdir / "redis.log", "ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {(self.workdir / 'redis.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(f"AUTH {self.password}\r\nPING\r\n".encode())
                    if b"PONG" in s.recv(64) or b"PONG" in s.recv(64):
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("redis-server did not answer within 20 s")

    def stop(self) -> None:
        """kill -9: an outage, not a shutdown."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None


@pytest.fixture
def redis_server(tmp_path: Path):
    """A fresh password-protected redis-server for one test."""
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.stop()
