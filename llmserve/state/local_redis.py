"""A redis-server of our own, for ``llmserve serve --replicas`` on one machine.

Never open: it listens on loopback only and requires a fresh random password, which
lives in a file only this user can read (``redis-password``), as does the server's
configuration (a password on the command line would show in ``ps``). Nothing is
saved to disk: the replicas hold the last known state and publish it again if the
server comes back empty.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

from llmserve.ports import free_port
from llmserve.state.redis_conn import StoreError, connect


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` where only this user can read it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, 0o600)  # an older file keeps its mode through O_TRUNC
    return path


class LocalRedis:
    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.port = free_port()
        self.password_file = self.workdir / "redis-password"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """Without the password (it is in ``password_file``)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 20.0) -> LocalRedis:
        binary = shutil.which("redis-server")
        if binary is None:
            raise StoreError("--replicas needs a redis-server (apt install redis-server) "
                             "or gateway.state.redis_url pointing at one")
        self.workdir.mkdir(parents=True, exist_ok=True)
        password = secrets.token_hex(24)
        write_private(self.password_file, password + "\n")
        write_private(self.workdir / "redis.conf", "\n".join([
            f"port {self.port}", "bind 127.0.0.1", "protected-mode yes", f"requirepass {password}",
            f'dir "{self.workdir}"', 'save ""', "appendonly no", ""]))
        self._binary = binary
        return self._launch(timeout_s)

    def revive(self, timeout_s: float = 20.0) -> bool:
        """Start it again if it died (same port and password: the replicas reconnect on their
        own and publish their state again into the empty store); True when it did."""
        if self.proc is None or self.proc.poll() is None:
            return False
        self._launch(timeout_s)
        return True

    def _launch(self, timeout_s: float) -> LocalRedis:
        with open(self.workdir / "redis.log", "ab") as log:
            self.proc = subprocess.Popen([self._binary, str(self.workdir / "redis.conf")], stdout=log,
                                         stderr=subprocess.STDOUT,
                                         start_new_session=True)  # Ctrl-C reaches serve, which stops it last
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise StoreError(f"redis-server exited at start (see {self.workdir / 'redis.log'})")
            try:
                asyncio.run(self._ping())
                return self
            except StoreError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.05)

    async def _ping(self) -> None:
        await (await connect(self.url, self.password_file)).aclose()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
