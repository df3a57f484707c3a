"""``llmserve serve --replicas N``: N gateway processes on one port, one store they share.

The parent is a supervisor: it starts a password-protected ``redis-server`` of its
own (``state/local_redis.py``) unless ``gateway.state.redis_url`` names one, writes
the configuration every replica reads (the same admin key, the store, a key for
Ray instances) to a file only this user can read, and starts N ``llmserve serve``
children. Each binds the port with ``SO_REUSEPORT``, so the kernel spreads new
connections over them and any one of them may die without the port going dark.
Every replica runs the elastic controllers; a pool's lease holder leads and publishes
it, the others mirror it (``autoscale/leadership.py``). Rollouts and admin overrides are
shared by all (``state/``). A replica that exits is started again; one that fails
within its first seconds (a bad configuration, a store that refuses it) stops the
set with its exit code. SIGTERM or Ctrl-C stops the replicas (each drains), then
the store.
"""

from __future__ import annotations

import logging
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from llmserve.serve.deployment import deep_merge
from llmserve.serve.serve_config import ServeConfig
from llmserve.state.gateway_state import check_store
from llmserve.state.local_redis import LocalRedis, write_private
from llmserve.state.redis_conn import StoreError

log = logging.getLogger(__name__)

EARLY_EXIT_S = 10.0  # a first start that fails this soon is a bad configuration or store


class Supervisor:
    """The replicas' processes: started, restarted, stopped."""

    def __init__(self, argv: list[str], n: int, workdir: Path, stop_grace_s: float) -> None:
        self.argv, self.n, self.workdir, self.stop_grace_s = argv, n, workdir, stop_grace_s
        self.procs: list[subprocess.Popen | None] = [None] * n
        self.also: Callable[[], None] = lambda: None  # each turn of the watch loop (the own Redis kept up)
        self.started_at = [0.0] * n
        self.restarts = [0] * n  # since the replica last ran past EARLY_EXIT_S
        self.ever_up = [False] * n
        self.stopping = False

    def _start(self, i: int) -> None:
        with open(self.workdir / f"replica-{i}.log", "ab") as out:
            self.procs[i] = subprocess.Popen([*self.argv, "--replica", str(i)], stdout=out,
                                             stderr=subprocess.STDOUT)
        self.started_at[i] = time.monotonic()

    def run(self) -> int:
        """Until stopped (0) or a replica fails at the set's start (its exit code). A
        replica that ran once and then fails is started again, backing off (a store
        away refuses a replica's start until it returns)."""
        for i in range(self.n):
            self._start(i)
        retry_at = [0.0] * self.n
        while not self.stopping:
            time.sleep(0.2)
            self.also()
            now = time.monotonic()
            for i, p in enumerate(self.procs):
                if self.stopping:
                    break
                if p is None:  # waiting to be started again
                    if now >= retry_at[i]:
                        self._start(i)
                    continue
                code = p.poll()
                if code is None:
                    if now - self.started_at[i] >= EARLY_EXIT_S:
                        self.ever_up[i], self.restarts[i] = True, 0
                    continue
                self.procs[i] = None
                # A replica that fails at once (not killed) will not do better restarted.
                if code > 0 and not self.ever_up[i] and now - self.started_at[i] < EARLY_EXIT_S:
                    tail = (self.workdir / f"replica-{i}.log").read_text(errors="replace").strip()
                    print(f"llmserve serve: replica {i} exited with {code} at start: "
                          f"{tail.splitlines()[-1] if tail else ''}", file=sys.stderr, flush=True)
                    return code or 1
                retry_at[i] = now + min(30.0, 2.0 ** self.restarts[i] - 1)
                self.restarts[i] += 1
                print(f"llmserve serve: replica {i} exited with {code}; starting it again "
                      f"in {retry_at[i] - now:.0f} s", file=sys.stderr, flush=True)
        return 0

    def stop(self) -> None:
        self.stopping = True
        live = [p for p in self.procs if p is not None and p.poll() is None]
        for p in live:
            p.send_signal(signal.SIGTERM)  # each drains: the last one out stops the instances
        deadline = time.monotonic() + self.stop_grace_s
        for p in live:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def run_replicas(cfg: ServeConfig, file: dict[str, Any], extra_argv: list[str]) -> int:
    """``file``: the configuration as given (file and flags), which every replica reads
    again with ``replicas: 1`` and the shared store filled in."""
    workdir = cfg.gateway.state.path(f"replicas-{cfg.port}")
    workdir.mkdir(parents=True, exist_ok=True)
    admin_key = cfg.admin_key or secrets.token_urlsafe(24)
    redis = None
    state: dict[str, Any] = {}
    if cfg.gateway.state.redis_url is None:
        try:
            redis = LocalRedis(workdir / "redis").start()
        except StoreError as e:
            raise SystemExit(f"llmserve: error: {e}") from None
        state = {"redis_url": redis.url, "redis_password_file": str(redis.password_file)}
    else:
        check_store(cfg.gateway.state.redis_url, cfg.gateway.state.redis_password_file)
    # state.replicas: how many share each key's limits while the store is away (tenants)
    state.setdefault("replicas", cfg.replicas)
    shared = {"replicas": 1, "admin_key": admin_key, "gateway": {"state": state}}
    if cfg.provider.kind == "ray" and cfg.instance_api_key is None:
        shared["instance_api_key"] = secrets.token_urlsafe(24)  # every replica must reach the instances
    path = write_private(workdir / "serve.yaml", yaml.safe_dump(deep_merge(file, shared)))
    sup = Supervisor([sys.executable, "-m", "llmserve.cli", "serve", "--config", str(path), *extra_argv],
                     cfg.replicas, workdir, cfg.lifecycle.drain_timeout_s + cfg.lifecycle.stop_grace_s + 10)

    def keep_redis_up() -> None:  # (the replicas' store: without it none could start again)
        try:
            if redis is not None and redis.revive():
                print(f"llmserve serve: the replicas' redis-server had exited; started again on {redis.url}",
                      file=sys.stderr, flush=True)
        except StoreError as e:  # (it stays down; the replicas degrade as with any store away)
            print(f"llmserve serve: the replicas' redis-server could not be started again: {e}",
                  file=sys.stderr, flush=True)

    sup.also = keep_redis_up

    def on_signal(signum, frame) -> None:
        sup.stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    base = f"http://{cfg.host}:{cfg.port}"
    store = "its own redis-server" if redis is not None else "the Redis at gateway.state.redis_url"
    print(f"llmserve serve: {cfg.replicas} gateway replicas on {base}/v1 (SO_REUSEPORT), sharing {store}\n"
          f"  dashboard {base}/dashboard{'' if cfg.admin_key else f'#key={admin_key}'}\n"
          f"  replica logs in {workdir}", flush=True)
    try:
        code = sup.run()
    finally:
        sup.stop()
        if redis is not None and cfg.provider.kind == "local":  # our store: no one else leads these
            # pools, so what a replica killed on its way out left listed is ours to stop
            from llmserve.serve.leases import stop_listed

            stop_listed(cfg.gateway.state.dir, cfg.lifecycle.stop_grace_s)
        if redis is not None:
            redis.stop()
    return code
