"""Live: ``llmserve serve --replicas 2`` (real processes): two gateway replicas on one
port (SO_REUSEPORT) and a password-protected redis-server of their own; replica 0's
controller starts the instance and the other replica routes to it too; a replica
killed -9 is started again while the port keeps answering; stopping serve stops all.

The instance is the foreign stand-in server (no torch), as in
tests/autoscale/test_live_foreign.py, so the test is cheap."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from llmserve.ports import free_port
from llmserve.state.redis_conn import StoreError, connect
from tests.autoscale.serve_harness import FAST_GATEWAY, ServeProcess, standin_config

pytestmark = pytest.mark.slow


def _children(pid: int) -> dict[int, str]:
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                out[int(p.name)] = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
    return out


def _fresh(url: str) -> int:
    """One completion on a new connection: the kernel picks the replica anew each time."""
    try:
        with httpx.Client(base_url=url, timeout=30, trust_env=False) as c:
            return c.post("/v1/completions", json={"model": "chat", "prompt": "hi", "max_tokens": 2}).status_code
    except httpx.HTTPError:
        return 0


def _wait(cond, timeout: float, what: str, proc) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"waiting for {what}: serve exited with {proc.poll()}")
        time.sleep(0.2)


async def _ping(port: str, password: str) -> None:
    await (await connect(f"redis://:{password}@127.0.0.1:{port}/0")).aclose()


def test_serve_replicas_one_port_their_own_redis(tmp_path):
    cfg = standin_config(max_instances=1)
    cfg["replicas"] = 2
    cfg["gateway"] = {**FAST_GATEWAY, "state": {"dir": str(tmp_path / "state")}}
    s = ServeProcess(cfg, tmp_path)
    workdir = tmp_path / "state" / f"replicas-{s.port}"
    try:
        streak = [0]

        def answering() -> bool:
            streak[0] = streak[0] + 1 if _fresh(s.url) == 200 else 0
            return streak[0] >= 10
        _wait(answering, 120, "both replicas to answer", s.proc)
        # Fresh connections land on either replica: a follower that had not mirrored
        # replica 0's instance would answer 503 for about half of them.
        codes = [_fresh(s.url) for _ in range(40)]
        assert codes == [200] * 40, codes
        kids = _children(s.proc.pid)
        replicas = {pid: cmd for pid, cmd in kids.items() if " serve " in cmd}
        assert sorted(cmd.rsplit("--replica ", 1)[1].strip() for cmd in replicas.values()) == ["0", "1"]
        assert any("redis-server" in cmd for cmd in kids.values()) and "requirepass" not in " ".join(kids.values())

        # The store: password-protected, its secret readable by this user alone.
        pw = workdir / "redis" / "redis-password"
        assert stat.S_IMODE(pw.stat().st_mode) == 0o600
        assert stat.S_IMODE((workdir / "serve.yaml").stat().st_mode) == 0o600  # it holds the admin key
        port = next(line.split()[1] for line in (workdir / "redis" / "redis.conf").read_text().splitlines()
                    if line.startswith("port "))
        with pytest.raises(StoreError, match="open Redis is refused"):
            asyncio.run(connect(f"redis://127.0.0.1:{port}/0"))
        with pytest.raises(StoreError, match="refused our credentials"):
            asyncio.run(connect(f"redis://:wrong@127.0.0.1:{port}/0"))

        # Any replica's admin API: the same admin key on both.
        for _ in range(6):
            with httpx.Client(base_url=s.url, timeout=30, trust_env=False) as c:
                r = c.get("/admin/models", headers={"authorization": f"Bearer {s.admin_key}"})
                assert r.status_code == 200 and r.json()["models"][0]["versions"][0]["instances"] == 1

        # kill -9 the follower: the port keeps answering, the supervisor starts it again.
        follower = next(pid for pid, cmd in replicas.items() if cmd.rstrip().endswith("--replica 1"))
        os.kill(follower, signal.SIGKILL)
        _wait(lambda: any(cmd.rstrip().endswith("--replica 1") and pid != follower
                          for pid, cmd in _children(s.proc.pid).items()), 30, "replica 1 again", s.proc)
        streak[0] = 0
        _wait(answering, 60, "both replicas to answer again", s.proc)
        assert [_fresh(s.url) for _ in range(20)] == [200] * 20

        # kill -9 the store: the supervisor starts it again on its port (a replica's start needs it)
        store = next(pid for pid, cmd in _children(s.proc.pid).items() if "redis-server" in cmd)
        os.kill(store, signal.SIGKILL)
        _wait(lambda: any("redis-server" in cmd and pid != store for pid, cmd in _children(s.proc.pid).items()),
              30, "the redis-server again", s.proc)
        _wait(lambda: "redis-server had exited; started again" in s.log(), 30, "the supervisor to say so", s.proc)
        asyncio.run(_ping(port, pw.read_text().strip()))
    finally:
        kids = _children(s.proc.pid)
        code = s.stop(90)
    assert code == 0, s.log()[-3000:]
    for pid in kids:  # the replicas and the store are gone with serve
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_serve_replicas_refuse_a_store_that_refuses_them(redis_server, tmp_path):
    cfg = standin_config(max_instances=1)
    bad = redis_server.url.replace(redis_server.password, "not-the-password")
    cfg.update(replicas=2, port=free_port(),
               gateway={"state": {"dir": str(tmp_path / "state"), "redis_url": bad}})
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(cfg))
    done = subprocess.run([sys.executable, "-m", "llmserve.cli", "serve", "--config", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
    assert "refused our credentials" in done.stderr and "not-the-password" not in done.stderr + done.stdout
