"""The gateway app: assembles config, pools, router, canary, monitor and HTTP routes.

``create_app(config) -> GatewayApp`` (a FastAPI app) builds it; ``run_gateway(config_path, host, port)``
serves it with uvicorn. The live :class:`Gateway` is ``app.state.gateway``; the
autoscaler reaches a pool with ``gateway.pool(model, version)`` (see ``pool.py``
for the pool's run-time interface).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import asynccontextmanager, suppress
from dataclasses import asdict
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from llmserve.gateway.admin import admin_router
from llmserve.gateway.auth import Privileges
from llmserve.gateway.canary import Action, CanaryAnalysis
from llmserve.gateway.config import GatewayConfig, ModelConfig
from llmserve.gateway.dashboard import dashboard_router
from llmserve.gateway.errors import GatewayError, error_response, from_exception
from llmserve.gateway.events import GatewayService, RequestObserver
from llmserve.gateway.health import RetryBudget
from llmserve.gateway.metrics import GatewayMetrics, gauge
from llmserve.gateway.monitor import Monitor
from llmserve.gateway.pool import Pool
from llmserve.gateway.proxy import Proxy
from llmserve.gateway.upstream import UpstreamClient
from llmserve.gateway.version_router import VersionRouter, with_weight
from llmserve.gateway.window_stats import WindowStats
from llmserve.http_guard import uvicorn_options

log = logging.getLogger(__name__)


class ModelRuntime:
    """One served model: its version router, one pool per version, its canary."""

    def __init__(self, config: ModelConfig, gateway: Gateway, rng: random.Random) -> None:
        self.config = config
        self.gateway = gateway
        gcfg = gateway.config
        self.pools: dict[str, Pool] = {}
        # Looked up on every request: a dict, not a scan of the config's list.
        self.upstream_models = {v.name: v.upstream_model for v in config.versions}
        self.upstream_auth = {v.name: v.api_key and f"Bearer {v.api_key.get_secret_value()}"
                              for v in config.versions}
        self.count_forced = config.canary is not None and config.canary.count_forced
        for v in config.versions:
            pool = Pool(f"{config.name}/{v.name}", admission=config.admission,
                        concurrency=config.concurrency, balancer=config.balancer,
                        breaker=gcfg.breaker, outlier=gcfg.outlier,
                        report_ttl_s=max(2.0, 8 * gcfg.polling.load_interval_s),
                        rng=random.Random(rng.random()))
            for url in v.upstreams:
                pool.add_instance(url)
            self.pools[v.name] = pool
        self.canary: CanaryAnalysis | None = None
        window = 60.0
        if config.canary is not None:
            self.canary = CanaryAnalysis(config.canary.version, config.canary.stable,
                                         config.canary)
            window = config.canary.interval_s
        self.stats = WindowStats(window)
        self.router = VersionRouter(self._weights(), salt=config.name,
                                    rng=random.Random(rng.random()))

    def _weights(self) -> dict[str, float]:
        base = self.config.base_weights
        if self.canary is None:
            return base
        return with_weight(base, self.canary.canary, self.canary.weight)

    def apply_weights(self) -> None:
        self.router.set_weights(self._weights())

    def tick(self, now: float) -> None:
        if self.canary is None:
            return
        d = self.canary.tick(now, self.stats.snapshot(self.canary.canary, now),
                             self.stats.snapshot(self.canary.stable, now))
        if d.action not in (Action.NONE, Action.SKIP):
            log.info("canary %s/%s: %s → %.0f%% (%s)", self.config.name, self.canary.canary,
                     d.action.value, 100 * d.weight, d.reason)
            self.apply_weights()

    def canary_action(self, action: str, reason: str) -> None:
        assert self.canary is not None
        getattr(self.canary, action)(time.time(), reason)
        log.info("canary %s/%s: %s by admin (%s)", self.config.name, self.canary.canary,
                 action, reason)
        self.apply_weights()

    def describe(self) -> dict:
        return {"name": self.config.name,
                "versions": [{"name": v.name, "base_weight": v.weight,
                              "weight": self.router.weights[v.name],
                              "instances": len(self.pools[v.name].instances())}
                             for v in self.config.versions],
                "canary": None if self.canary is None else self.canary.status()}

    def describe_pool(self, version: str) -> dict:
        pool = self.pools[version]
        queues = {p.name.lower(): asdict(s) for p, s in pool.queue_stats().items()}
        return {"model": self.config.name, "version": version,
                "weight": self.router.weights[version], "instances": pool.snapshot(),
                "queues": queues}


class Gateway:
    def __init__(self, config: GatewayConfig, *, rng: random.Random | None = None) -> None:
        self.config = config
        rng = rng or random.Random()
        self.metrics = GatewayMetrics(self._gauges)
        self.retry_budget = RetryBudget(config.retry.budget)
        self.models = {m.name: ModelRuntime(m, self, rng) for m in config.models}
        self.proxy = Proxy(self)
        self.observers: list[RequestObserver] = []  # e.g. the autoscaler's signal collector
        # Started after the gateway's own tasks, stopped before them (e.g. the elastic
        # controller, which drains its instances while the proxy still works).
        self.services: list[GatewayService] = []
        self.upstream: UpstreamClient | None = None  # the request path and the polls
        self.monitor: Monitor | None = None
        self._tasks: list[asyncio.Task] = []
        self.started = False
        self._starting: asyncio.Lock | None = None

    def pool(self, model: str, version: str) -> Pool:
        return self.models[model].pools[version]

    def pools(self) -> Iterator[Pool]:
        for rt in self.models.values():
            yield from rt.pools.values()

    async def ensure_started(self) -> None:
        """Start once, on whichever comes first: the ASGI lifespan or the first request.

        A host that never sends lifespan events (a Starlette ``Mount``, a server run
        with ``lifespan="off"``) still gets the health polls and canary ticks."""
        if self.started:
            return
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if not self.started:
                await self.start()

    async def start(self) -> None:
        if self.started:
            return
        self.started = True
        lim = self.config.limits
        self.upstream = UpstreamClient(connect_timeout=lim.connect_timeout_s,
                                       read_timeout=lim.request_timeout_s,
                                       # under uvicorn's 5 s keep-alive: never reuse one the engine closed
                                       keepalive_expiry=4.0)
        self.monitor = Monitor(self.pools, self.upstream, self.config.polling)
        now = time.time()
        for rt in self.models.values():
            if rt.canary is not None and rt.config.canary.auto_start:
                rt.canary.start(now, "started with the gateway")
                rt.apply_weights()
        self._tasks = [asyncio.create_task(self.monitor.run(), name="monitor"),
                       asyncio.create_task(self._canary_loop(), name="canary")]
        for s in self.services:
            await s.start()

    async def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        for s in reversed(self.services):
            try:
                await s.stop()
            except Exception:  # the gateway's own shutdown must still run
                log.exception("stopping service %r failed", s)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with suppress(asyncio.CancelledError):
                await t
        if self.monitor is not None:
            self.monitor.close()
        if self.upstream is not None:
            await self.upstream.aclose()

    async def _canary_loop(self) -> None:
        intervals = [rt.config.canary.interval_s for rt in self.models.values()
                     if rt.config.canary is not None]
        if not intervals:
            return
        period = max(0.01, min(1.0, min(intervals) / 10))
        while True:
            await asyncio.sleep(period)
            now = time.time()
            for rt in self.models.values():
                try:
                    rt.tick(now)
                except Exception:  # one model's bug must not stop the others' rollouts
                    log.exception("canary tick failed for %s", rt.config.name)

    def ready(self) -> bool:
        return any(v.routable for p in self.pools() for v in p.views(time.monotonic()))

    def _gauges(self) -> Iterable:
        depth = gauge("queue_depth", "Requests waiting in the gateway's queue",
                      ["model", "version", "class"])
        oldest = gauge("queue_oldest_wait_seconds", "Wait of the oldest queued request",
                       ["model", "version", "class"])
        weight = gauge("version_weight", "Share of traffic routed to each version",
                       ["model", "version"])
        inflight = gauge("instance_inflight", "Requests in flight to each instance",
                         ["model", "version", "instance"])
        ready = gauge("instance_ready", "1 if the instance passes /ready",
                      ["model", "version", "instance"])
        breaker = gauge("instance_breaker_open", "0 closed, 0.5 half-open, 1 open",
                        ["model", "version", "instance"])
        level = {"closed": 0.0, "half_open": 0.5, "open": 1.0}
        for name, rt in self.models.items():
            for version, pool in rt.pools.items():
                weight.add_metric([name, version], rt.router.weights[version])
                for p, s in pool.queue_stats().items():
                    depth.add_metric([name, version, p.name.lower()], s.depth)
                    oldest.add_metric([name, version, p.name.lower()], s.oldest_wait_s)
                for iid, state in pool.breaker_states().items():
                    inst = pool.get(iid)
                    inflight.add_metric([name, version, iid], inst.inflight)
                    ready.add_metric([name, version, iid], float(inst.ready))
                    breaker.add_metric([name, version, iid], level[state.value])
        return [depth, oldest, weight, inflight, ready, breaker]


def body_limit_response(scope: Scope, max_body_bytes: int) -> Response | None:
    """413 for a declared body over the limit, else None (header and URL sizes are
    the HTTP protocol's to refuse: ``llmserve.http_guard``)."""
    for k, v in scope["headers"]:
        if k == b"content-length" and v.isdigit() and int(v) > max_body_bytes:
            return error_response(413, f"the request body is over the limit of {max_body_bytes} bytes",
                                  code="body_too_large")
    return None


PROXY_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


class GatewayApp(FastAPI):
    """FastAPI, with the two proxied routes taken before its middleware and routing.

    Every request's declared body size is checked first. A POST to
    ``/v1/completions`` or ``/v1/chat/completions`` then goes straight to the
    proxy: FastAPI's exception, telemetry and exit-stack middleware, route
    matching and dependency solving were about 40 % of the gateway's CPU per
    proxied request and do nothing for a handler that takes the raw request.
    Everything else (models, health, metrics, admin, dashboard) is FastAPI's.
    """

    gateway: Gateway
    check_client: Callable[[Request], Privileges]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if not self.gateway.started:
                await self.gateway.ensure_started()
            response = body_limit_response(scope, self.gateway.config.limits.max_body_bytes)
            path = scope["path"]
            root = scope.get("root_path", "")
            if root and path.startswith(root):  # mounted: Starlette keeps the full path
                path = path[len(root):]
            if response is None and path in PROXY_PATHS:
                if scope["method"] == "POST":
                    response = await self._proxy(Request(scope, receive, send), path)
                else:
                    response = error_response(405, f"{path} takes POST", code="method_not_allowed",
                                              headers={"allow": "POST"})
            if response is not None:
                await response(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    async def _proxy(self, request: Request, path: str) -> Response:
        try:
            client = self.check_client(request)
            return await self.gateway.proxy.handle(request, path, client)
        except GatewayError as e:
            return from_exception(e)
        except ClientDisconnect:
            return error_response(499, "the client closed the request", code="client_disconnected")
        except Exception as e:  # noqa: BLE001 - an OpenAI-shaped 500, never a bare one
            log.exception("unhandled error on %s", path)
            return error_response(500, f"internal gateway error: {type(e).__name__}", code="internal_error")


def create_app(config: GatewayConfig) -> GatewayApp:
    gw = Gateway(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await gw.ensure_started()
        try:
            yield
        finally:
            await gw.stop()

    app = GatewayApp(title="llmserve gateway", lifespan=lifespan, docs_url=None, redoc_url=None,
                     openapi_url=None)
    app.state.gateway = app.gateway = gw
    auth = config.auth.client_auth()

    def check_client(request: Request) -> Privileges:
        return auth.identify(request.headers.get("authorization"))

    app.check_client = check_client

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, e: GatewayError) -> JSONResponse:
        return from_exception(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return error_response(e.status_code, str(e.detail), headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return error_response(500, f"internal gateway error: {type(e).__name__}",
                              code="internal_error")

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        return error_response(400, f"invalid request: {e.errors()}", code="invalid_request")

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict:
        check_client(request)
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "llmserve"}
            for name in gw.models]}

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> Response:
        if gw.ready():
            return JSONResponse({"status": "ready"})
        return error_response(503, "no upstream instance is ready", code="not_ready")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(gw.metrics.exposition(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    app.include_router(admin_router(gw))
    app.include_router(dashboard_router(gw))
    return app


def run_gateway(config_path: str | Path, host: str = "127.0.0.1", port: int = 8080,
                log_level: str = "info", access_log: bool = False) -> None:
    import uvicorn

    config = GatewayConfig.load(config_path)
    uvicorn.run(create_app(config), host=host, port=port, log_level=log_level, access_log=access_log,
                **uvicorn_options(config.limits.http_limits()),
                # The gateway never reads the client address, so no X-Forwarded-* rewriting.
                proxy_headers=False)
