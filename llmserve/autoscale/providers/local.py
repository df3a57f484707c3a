"""The default provider: ``llmserve engine`` subprocesses on free loopback ports.

Each instance gets its share of the machine's CPU threads through the spec's
``--threads`` (the caller sizes it). The engine opens its port at once and loads
weights in the background, so ``start`` returns in milliseconds and the
controller watches ``/ready``.

A spec with a ``command`` (a foreign OpenAI-compatible server) is spawned from
that command, its ``{host}`` / ``{port}`` / ``{instance_id}`` filled in.

By default instances are forked from a template process that has already
imported torch and the server (``server/fork_server.py``): that is ~2.5 s of
each start-up paid once. ``fork_from_template=False`` spawns a fresh
interpreter per instance.

Every start is granted whatever its capacity class; :meth:`LocalProvider.reclaim`
simulates a spot reclaim (a notice, then SIGKILL at its deadline) for tests and
benchmarks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from llmserve.autoscale.providers.base import InstanceHandle, InstanceSpec, RunState, RunStatus
from llmserve.autoscale.providers.process import engine_argv, engine_command, foreign_command, spawn, tail
from llmserve.autoscale.providers.registry import AdoptedProcess, ProcessRegistry, Registered, process_start
from llmserve.ports import free_port
from llmserve.server.fork_server import ForkedProcess, Template, TemplateError, needs_fresh_process

log = logging.getLogger(__name__)


class LocalProviderConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    log_dir: str | None = None  # None: a fresh temporary folder
    fork_from_template: bool = True
    template_ready_timeout_s: float = 120.0
    # Replicas: instances outlive this process (no template, no death with the parent)
    # and are listed here, so the next leader adopts them (providers/registry.py).
    registry_dir: str | None = None


class LocalProvider:
    """Subprocesses of this process; stopped with SIGTERM (drain), then SIGKILL."""

    name = "local"

    def __init__(self, config: LocalProviderConfig | None = None) -> None:
        self.config = config or LocalProviderConfig()
        self.log_dir = Path(self.config.log_dir or tempfile.mkdtemp(prefix="llmserve-instances-"))
        self._procs: dict[str, subprocess.Popen | ForkedProcess] = {}
        self._ports: set[int] = set()
        self._reclaim_at: dict[str, float] = {}  # unix deadline, by instance id
        self._kills: dict[str, asyncio.TimerHandle] = {}
        self.registry = ProcessRegistry(self.config.registry_dir) if self.config.registry_dir else None
        forks = self.config.fork_from_template and self.registry is None
        self.template = Template(self.log_dir / "template.log") if forks else None

    async def start(self, spec: InstanceSpec) -> InstanceHandle:
        host = self.config.host
        port = free_port(host, self._ports)
        self._ports.add(port)
        log_path = self.log_dir / f"{spec.instance_id}.log"
        dies_with_us = self.registry is None  # without replicas no one else could stop it
        if spec.command:  # a foreign server: its own process, never forked from the template
            proc = spawn(foreign_command(spec.command, host, port, spec.instance_id), log_path, dict(spec.env),
                         dies_with_us)
        else:
            proc = await self._fork(engine_argv(spec.engine_args, host, port, spec.instance_id), log_path,
                                    dict(spec.env))
        if proc is None:
            # Popen runs on the loop's thread on purpose: PR_SET_PDEATHSIG fires when the
            # *thread* that forked ends, and a worker thread of to_thread() ends early.
            proc = spawn(engine_command(spec.engine_args, host, port, spec.instance_id), log_path,
                         dict(spec.env), dies_with_us)
        self._procs[spec.instance_id] = proc
        url = f"http://{host}:{port}"
        if self.registry is not None:
            self.registry.record(Registered(spec.instance_id, spec.pool, proc.pid, process_start(proc.pid) or 0,
                                            port, url, str(log_path), spec.token))
        return InstanceHandle(spec.instance_id, url, self.name, {"pid": proc.pid, "port": port, "log": str(log_path)})

    async def _fork(self, argv: list[str], log_path: Path, env: dict[str, str]) -> ForkedProcess | None:
        """The instance forked from the template; None where a fresh process is needed."""
        t = self.template
        if t is None or needs_fresh_process(env):
            return None
        if not await asyncio.to_thread(t.wait_ready, self.config.template_ready_timeout_s):
            log.warning("template process unusable (%s); spawning instances instead", t.error or "not ready")
            return None
        try:
            return await asyncio.to_thread(t.spawn, argv, log_path, env)
        except TemplateError as e:
            log.warning("template process could not fork (%s); spawning instead", e)
            return None

    async def reclaim(self, handle: InstanceHandle, notice_s: float) -> float | None:
        """Take the instance as a cloud takes a spot one: ``status`` reports the deadline
        from now on, and SIGKILL comes at it (``notice_s`` 0: at once). The deadline, or
        None when the instance is not running."""
        iid = handle.instance_id
        proc = self._procs.get(iid)
        if proc is None or proc.poll() is not None or iid in self._reclaim_at:
            return self._reclaim_at.get(iid)
        self._reclaim_at[iid] = time.time() + notice_s
        log.info("instance %s reclaimed, killed in %.1fs", iid, notice_s)
        if notice_s <= 0:
            proc.kill()
        else:
            self._kills[iid] = asyncio.get_running_loop().call_later(notice_s, self._kill, iid)
        return self._reclaim_at[iid]

    def _kill(self, instance_id: str) -> None:
        self._kills.pop(instance_id, None)
        proc = self._procs.get(instance_id)
        if proc is not None and proc.poll() is None:
            proc.kill()

    async def stop(self, handle: InstanceHandle, grace_s: float) -> int | None:
        proc = self._procs.get(handle.instance_id)
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
                while proc.poll() is None:
                    await asyncio.sleep(0.02)
        self._procs.pop(handle.instance_id, None)  # a reclaim's kill, still to come, finds nothing
        self._ports.discard(handle.ref.get("port", -1))
        if self.registry is not None:
            self.registry.remove(handle.instance_id)
        return proc.returncode

    # ---- replicas: the listing a new leader adopts from ----------------------------------------
    async def listing(self, pool: str) -> list[InstanceHandle]:
        """The pool's registered instances still running (any leader's)."""
        if self.registry is None:
            return []
        return [InstanceHandle(e.instance_id, e.url, self.name,
                               {"pid": e.pid, "port": e.port, "log": e.log, "token": e.token})
                for e in self.registry.live(pool)]

    async def adopt(self, handle: InstanceHandle, token: int | None) -> bool:
        """Take over a listed instance (watch it, stop it); False when it is gone."""
        entry = next((e for e in self.registry.live() if e.instance_id == handle.instance_id), None) \
            if self.registry is not None else None
        if entry is None:
            return False
        entry = dataclasses.replace(entry, token=token)
        self.registry.record(entry)
        if handle.instance_id not in self._procs:
            self._procs[handle.instance_id] = AdoptedProcess(entry)
            self._ports.add(entry.port)
        return True

    def detach(self, instance_ids) -> None:
        """Forget these instances without stopping them: another replica leads their pool now."""
        for iid in instance_ids:
            self._procs.pop(iid, None)

    async def status(self, handle: InstanceHandle) -> RunStatus:
        proc = self._procs.get(handle.instance_id)
        if proc is None:
            return RunStatus(RunState.VANISHED, detail="not started by this provider")
        code = proc.poll()
        at = self._reclaim_at.get(handle.instance_id)
        if code is None:
            return RunStatus(RunState.RUNNING, reclaim_at=at)
        detail = f"exited with code {code}" + (" (reclaimed)" if at is not None else "")
        last = tail(Path(handle.ref.get("log", "")), 1).strip() if code and code > 0 else ""
        if last:  # why, where the console reads it: a bad model's one line (exit 2), a crash's last line
            detail += f": {last[:300]}"
        return RunStatus(RunState.EXITED, code, detail, reclaim_at=at)

    async def log_tail(self, handle: InstanceHandle, lines: int = 20) -> str:
        return tail(Path(handle.ref.get("log", "")), lines)

    async def close(self) -> None:
        for timer in self._kills.values():
            timer.cancel()
        self._kills.clear()
        procs = list(self._procs.items())
        for _, proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10.0
        for _, proc in procs:
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        self._procs.clear()
        if self.template is not None:
            await asyncio.to_thread(self.template.close)
