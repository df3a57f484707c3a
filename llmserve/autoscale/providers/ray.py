"""Instances as Ray actors: each actor runs one engine server on its node.

The controller asks Ray for an actor with the instance's resources (``num_cpus``
here, ``num_gpus`` on a GPU cluster); Ray places it on a node that has them (and
Ray's own cluster autoscaler adds nodes when none has). The actor starts
``llmserve engine`` as a subprocess and reports its address; the gateway then
talks to the engine over plain HTTP, like to any other instance. The engine
listens on loopback when the Ray runtime is this machine's alone and on its
node's address only on a real cluster (:func:`engine_host`); either way ``serve``
gives the pool an API key (``ServeConfig.instance_key``), so a port reachable
from the network serves only the gateway. Stopping asks the actor to SIGTERM its engine (which drains and exits
0), then kills the actor; the engine is set to die with the actor in any case.

Only plain data crosses to and from actors: argv lists, strings, numbers.
``llmserve`` must be importable on every node (the same package the driver runs).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llmserve.autoscale.providers.base import InstanceHandle, InstanceSpec, RunState, RunStatus
from llmserve.autoscale.providers.process import engine_command, foreign_command, spawn, tail, terminate
from llmserve.ports import is_loopback
from llmserve.ports import free_port

log = logging.getLogger(__name__)


class RayProviderConfig(BaseModel):
    """``address``: an existing cluster (``"auto"``, ``"ray://head:10001"``); None starts
    a local runtime. ``bind_host``: the address engines listen on; None decides by
    the runtime (:func:`engine_host`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    address: str | None = None
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: dict[str, float] = Field(default_factory=dict)
    bind_host: str | None = None
    log_dir: str | None = None  # on each node; None: a temporary folder there
    local_num_cpus: int | None = None  # a local runtime's CPU count (None: all)
    namespace: str = "llmserve"
    call_timeout_s: float = 10.0
    # Replicas: actors outlive the driver that made them (Ray's "detached" lifetime), so
    # the next leader finds them by name (``listing``) and adopts them.
    detached: bool = False

    @model_validator(mode="after")
    def _checked(self) -> RayProviderConfig:
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError("ray provider: num_cpus and num_gpus must be >= 0")
        if self.call_timeout_s <= 0:
            raise ValueError("ray provider: call_timeout_s must be positive")
        return self


ACTOR_PREFIX = "llmserve-"


def actor_name(instance_id: str) -> str:
    return f"{ACTOR_PREFIX}{instance_id}"


def engine_host(bind_host: str | None, address: str | None) -> str | None:
    """Where a Ray-hosted engine listens: ``bind_host`` when configured; loopback when
    the runtime is this machine's alone (``address`` None: the runtime ``connect``
    starts here; or a head reached on 127.0.0.1 / localhost); else None, each
    node's own address, which a real cluster needs. ``"auto"`` may find a cluster
    of many nodes, so it counts as one. A loopback engine is kept on this node
    (``RayProvider.start``): elsewhere nothing here could reach it."""
    if bind_host:
        return bind_host
    if address is None:
        return "127.0.0.1"
    host = urlsplit("//" + address.split("://", 1)[-1]).hostname or ""
    return "127.0.0.1" if is_loopback(host) else None


class EngineActor:
    """Runs on a Ray worker: owns one engine subprocess. Wrapped by ``ray.remote`` at use."""

    def __init__(self, engine_args: list[str], instance_id: str, bind_host: str | None,
                 log_dir: str | None, env: dict[str, str], command: list[str] | None = None,
                 pool: str = "", token: int | None = None) -> None:
        import ray

        self.instance_id, self.pool, self.token = instance_id, pool, token
        host = bind_host or ray.util.get_node_ip_address()
        self.port = free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.log_path = Path(log_dir or tempfile.gettempdir()) / f"llmserve-{instance_id}.log"
        argv = (foreign_command(tuple(command), host, self.port, instance_id) if command
                else engine_command(engine_args, host, self.port, instance_id))
        self.proc: subprocess.Popen = spawn(argv, self.log_path, env)
        self.node_id = ray.get_runtime_context().get_node_id()

    def address(self) -> dict[str, Any]:
        return {"url": self.url, "node_id": self.node_id, "pid": self.proc.pid,
                "log": str(self.log_path), "host_pid": os.getpid(), "instance_id": self.instance_id,
                "pool": self.pool, "token": self.token}

    def set_token(self, token: int | None) -> None:
        self.token = token  # the leader that adopted it

    def status(self) -> tuple[str, int | None]:
        code = self.proc.poll()
        return ("running", None) if code is None else ("exited", code)

    def stop(self, grace_s: float) -> int | None:
        return terminate(self.proc, grace_s)

    def log_tail(self, lines: int) -> str:
        return tail(self.log_path, lines)


class RayProvider:
    """Creates and kills ``EngineActor`` actors; routes to their node address."""

    name = "ray"

    def __init__(self, config: RayProviderConfig | None = None) -> None:
        self.config = config or RayProviderConfig()
        self._actors: dict[str, Any] = {}
        self._actor_cls: Any = None
        self._started_runtime = False

    def connect(self) -> None:
        """Attach to the cluster, or start a local runtime. Blocking: call before serving."""
        import ray

        if ray.is_initialized():
            return
        cfg = self.config
        kwargs: dict[str, Any] = {"namespace": cfg.namespace, "log_to_driver": False}
        if cfg.address is None:
            # "local": a new runtime on this machine, never one found through RAY_ADDRESS
            # or a `ray start` here (engine_host counts on that).
            kwargs.update(address="local", include_dashboard=False, num_cpus=cfg.local_num_cpus)
            self._started_runtime = True
        else:
            kwargs["address"] = cfg.address
        # ray.init installs a SIGTERM handler that exits the driver with code 15; the
        # server's own handler (drain, then stop instances, then ray.shutdown) must win.
        before = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
        ray.init(**kwargs)
        if before is not None:
            signal.signal(signal.SIGTERM, before)

    async def start(self, spec: InstanceSpec) -> InstanceHandle:
        import ray

        cfg = self.config
        if self._actor_cls is None:
            self._actor_cls = ray.remote(EngineActor)
        host = engine_host(cfg.bind_host, cfg.address)
        options: dict[str, Any] = {}
        if host is not None and is_loopback(host):
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                ray.get_runtime_context().get_node_id(), soft=False)
        actor_cls = self._actor_cls.options(
            num_cpus=cfg.num_cpus, num_gpus=cfg.num_gpus, resources=dict(cfg.resources) or None,
            max_restarts=0, name=actor_name(spec.instance_id), **options,
            **({"lifetime": "detached"} if cfg.detached else {}))
        actor = actor_cls.remote(list(spec.engine_args), spec.instance_id, host, cfg.log_dir,
                                 dict(spec.env), list(spec.command) or None, spec.pool, spec.token)
        self._actors[spec.instance_id] = actor
        try:
            # No timeout here: a pending actor waits for Ray to find (or add) a node; the
            # controller's start timeout bounds the whole cold start instead.
            ref = await actor.address.remote()
        except BaseException:
            self._actors.pop(spec.instance_id, None)
            ray.kill(actor, no_restart=True)
            raise
        return InstanceHandle(spec.instance_id, ref["url"], self.name,
                              {k: v for k, v in ref.items() if k not in ("url", "instance_id")})

    async def stop(self, handle: InstanceHandle, grace_s: float) -> int | None:
        import ray

        actor = self._actors.pop(handle.instance_id, None)
        if actor is None:
            return None
        code = None
        try:
            code = await asyncio.wait_for(actor.stop.remote(grace_s),
                                          grace_s + self.config.call_timeout_s)
        except Exception as e:  # noqa: BLE001 - the actor may be gone already
            log.info("ray instance %s: stop call failed (%s); killing the actor", handle.instance_id, e)
        ray.kill(actor, no_restart=True)
        return code

    async def status(self, handle: InstanceHandle) -> RunStatus:
        from ray.exceptions import RayActorError

        actor = self._actors.get(handle.instance_id)
        if actor is None:
            return RunStatus(RunState.VANISHED, detail="no such actor")
        try:
            state, code = await asyncio.wait_for(actor.status.remote(), self.config.call_timeout_s)
        except RayActorError as e:
            return RunStatus(RunState.VANISHED, detail=f"actor died: {type(e).__name__}")
        except Exception as e:  # noqa: BLE001 - a slow call (timeout) or a broken one
            return RunStatus(RunState.UNKNOWN, detail=f"status call failed: {type(e).__name__}")
        if state == "running":
            return RunStatus(RunState.RUNNING)
        return RunStatus(RunState.EXITED, code, f"engine exited with code {code}")

    # ---- replicas: the listing a new leader adopts from ----------------------------------------
    async def listing(self, pool: str) -> list[InstanceHandle]:
        """The pool's actors, found by name in this namespace (any driver's)."""
        import ray

        out = []
        for name in ray.util.list_named_actors():
            if not name.startswith(ACTOR_PREFIX):
                continue
            try:
                ref = await asyncio.wait_for(ray.get_actor(name).address.remote(), self.config.call_timeout_s)
            except Exception as e:  # noqa: BLE001 - dying, or not an engine actor
                log.info("ray actor %s not listed: %s", name, type(e).__name__)
                continue
            if ref.get("pool") == pool:
                out.append(InstanceHandle(ref["instance_id"], ref["url"], self.name,
                                          {k: v for k, v in ref.items() if k not in ("url", "instance_id")}))
        return out

    async def adopt(self, handle: InstanceHandle, token: int | None) -> bool:
        import ray

        try:
            actor = ray.get_actor(actor_name(handle.instance_id))
            await asyncio.wait_for(actor.set_token.remote(token), self.config.call_timeout_s)
        except Exception:  # noqa: BLE001 - gone meanwhile
            return False
        self._actors[handle.instance_id] = actor
        return True

    def detach(self, instance_ids) -> None:
        """Forget these actors, running: another replica leads their pool now."""
        for iid in instance_ids:
            self._actors.pop(iid, None)

    async def log_tail(self, handle: InstanceHandle, lines: int = 20) -> str:
        actor = self._actors.get(handle.instance_id)
        if actor is None:
            return ""
        try:
            return await asyncio.wait_for(actor.log_tail.remote(lines), self.config.call_timeout_s)
        except Exception:  # noqa: BLE001 - best effort
            return ""

    async def close(self) -> None:
        import ray

        handles = list(self._actors)
        for iid in handles:
            await self.stop(InstanceHandle(iid, "", self.name), 10.0)
        if self._started_runtime and ray.is_initialized():
            t = time.monotonic()
            ray.shutdown()
            log.info("local ray runtime shut down in %.1f s", time.monotonic() - t)
