"""Runs a real gateway (uvicorn, loopback) in front of fake upstreams, for app tests."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager

import httpx

from llmserve.gateway.app import create_app
from llmserve.gateway.config import GatewayConfig
from llmserve.gateway.runtime import Gateway
from llmserve.http_guard import uvicorn_options
from .fake_upstream import Behaviour, ServerThread, make_app

FAST_POLLING = {"load_interval_s": 0.05, "ready_interval_s": 0.1, "timeout_s": 0.5}
ADMIN_KEY = "admin-key-for-tests-0123456789"
CLIENT_KEY = "client-key-for-tests"
OPS_KEY = "ops-key-for-tests-0123"
# A client key with default privileges and one that may force a version and send on
# integer priorities in [-10, 10].
PRIVILEGED_AUTH = {"api_keys": [CLIENT_KEY],
                   "keys": [{"key": OPS_KEY, "version_override": True, "priority_range": [-10, 10]}]}


def bearer(key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"} if key else {}


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.02)


class Stack:
    def __init__(self, gateway: Gateway, server: ServerThread, fakes: dict[str, Behaviour],
                 upstreams: dict[str, ServerThread], client_key: str | None = None) -> None:
        self.gateway = gateway
        self.server = server
        self.fakes = fakes
        self.upstreams = upstreams
        self.url = server.url
        self.client = httpx.Client(base_url=server.url, timeout=30, headers=bearer(client_key))

    def chat(self, content: str = "hello", *, model: str = "chat", headers=None,
             key: str | None = None, **body) -> httpx.Response:
        """``key``: send as that client instead of the stack's default one."""
        payload = {"model": model, "messages": [{"role": "user", "content": content}], **body}
        return self.client.post("/v1/chat/completions", json=payload,
                                headers={**(headers or {}), **bearer(key)})

    def admin(self, method: str, path: str, **kw) -> httpx.Response:
        headers = {"authorization": f"Bearer {ADMIN_KEY}"}
        return self.client.request(method, f"/admin{path}", headers=headers, **kw)

    def all_ready(self) -> bool:
        return all(i.ready for p in self.gateway.pools() for i in p.instances())


@contextmanager
def stack(versions: dict[str, list[Behaviour]], *, model: dict | None = None,
          weights: dict[str, float] | None = None, dead: dict[str, int] | None = None,
          version_extra: dict[str, dict] | None = None, wait_ready: bool = True,
          client_key: str | None = None, telemetry=None, **top):
    """Fake upstreams per version (plus ``dead`` ports with nothing listening), a
    gateway configured over them; yields a :class:`Stack` whose client sends
    ``client_key`` (None: no key)."""
    upstreams: dict[str, ServerThread] = {}
    fakes: dict[str, Behaviour] = {}
    state_dir = tempfile.mkdtemp(prefix="llmserve-state-")  # never the user's ~/.cache/llmserve/state
    try:
        version_cfgs = []
        for name, behaviours in versions.items():
            urls = []
            for b in behaviours:
                srv = ServerThread(make_app(b)).start()
                upstreams[b.instance_id] = srv
                fakes[b.instance_id] = b
                urls.append(srv.url)
            if dead and name in dead:
                urls.append(f"http://127.0.0.1:{dead[name]}")
            w = (weights or {}).get(name, 1.0)
            version_cfgs.append({"name": name, "weight": w, "upstreams": urls,
                                 **(version_extra or {}).get(name, {})})
        data = {"models": [{"name": "chat", "versions": version_cfgs, **(model or {})}],
                "polling": FAST_POLLING, "auth": {"admin_key": ADMIN_KEY}, "state": {"dir": state_dir}}
        for k, v in top.items():
            data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) else v
        config = GatewayConfig.model_validate(data)
        app = create_app(config, telemetry)
        # Served as run_gateway serves it: the connection limits are the protocol's.
        server = ServerThread(app, **uvicorn_options(config.limits.http_limits())).start()
        s = Stack(app.state.gateway, server, fakes, upstreams, client_key)
        try:
            if wait_ready:
                live = {srv.url for srv in upstreams.values()}
                wait_until(lambda: all(i.ready for p in s.gateway.pools()
                                       for i in p.instances() if i.url in live),
                           what="upstreams ready")
            yield s
        finally:
            s.client.close()
            server.stop(force=True)
    finally:
        for srv in upstreams.values():
            if srv.thread.is_alive():
                srv.stop(force=True)
        shutil.rmtree(state_dir, ignore_errors=True)


def instance_of(response: httpx.Response) -> str:
    return response.headers["x-llmserve-upstream"]


def sse_events(text: str) -> list[str]:
    return [e[len("data: "):] for e in text.split("\n\n") if e.startswith("data: ")]
