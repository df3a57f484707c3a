"""The gateway's HTTP side: the ASGI app and its routes, assembled around a runtime.

``create_app(config) -> GatewayApp`` (a FastAPI app) builds a :class:`Gateway`
(``runtime.py``: pools, router, canary, monitor, no HTTP) and serves it;
``run_gateway(config_path, host, port)`` runs that with uvicorn. The live
:class:`Gateway` is ``app.state.gateway``; the autoscaler reaches a pool with
``gateway.pool(model, version)``.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from llmserve.api.limits import body_too_large, declared_over
from llmserve.api.frontends import Frontends
from llmserve.api.model_list import model_list, with_anthropic_fields
from llmserve.gateway.admin import admin_router
from llmserve.gateway.batches.runner import PRIVILEGES_KEY
from llmserve.gateway.auth import Privileges
from llmserve.gateway.config import GatewayConfig
from llmserve.gateway.dashboard import dashboard_router
from llmserve.gateway.errors import GatewayError, error_response, from_exception, validation_error_response
from llmserve.gateway.frontends import gateway_frontends
from llmserve.gateway.model_cards import ModelCards
from llmserve.gateway.proxy import Proxy
from llmserve.gateway.runtime import Gateway
from llmserve.gateway.tenants.admin import keys_router
from llmserve.gateway.version_router import VERSION_HEADER
from llmserve.state.gateway_state import check_store
from llmserve.http_guard import uvicorn_options
from llmserve.tracing.config import TracingConfig
from llmserve.tracing.start import start_tracing

if TYPE_CHECKING:  # OpenTelemetry is imported only when asked for
    from llmserve.tracing.gateway import GatewayTelemetry

log = logging.getLogger(__name__)


def body_limit_response(scope: Scope, max_body_bytes: int) -> Response | None:
    """413 for a declared body over the limit, else None (header and URL sizes are
    the HTTP protocol's to refuse: ``llmserve.http_guard``)."""
    if declared_over(scope["headers"], max_body_bytes):
        err = body_too_large(max_body_bytes)
        return error_response(err.status, err.message, code=err.code)
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
    proxy: Proxy
    check_client: Callable[[Request], Privileges]
    frontends: Frontends

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if not self.gateway.started:
                await self.gateway.ensure_started()
            path = scope["path"]
            root = scope.get("root_path", "")
            if root and path.startswith(root):  # mounted: Starlette keeps the full path
                path = path[len(root):]
            cfg = self.gateway.config
            limit = cfg.batches.upload_body_bytes if path == "/v1/files" else cfg.limits.max_body_bytes
            response = body_limit_response(scope, limit)
            if response is None and self.frontends.handles(path):  # responses, messages, files, batches
                await self.frontends({**scope, "path": path}, receive, send)
                return
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
            # a batch line sent in process carries its privileges in the scope (no client can set it)
            client = request.scope.get(PRIVILEGES_KEY) or self.check_client(request)
            return await self.proxy.handle(request, path, client)
        except GatewayError as e:
            self._refused(request, e)
            return from_exception(e)
        except ClientDisconnect:
            return error_response(499, "the client closed the request", code="client_disconnected")
        except Exception as e:  # noqa: BLE001 - an OpenAI-shaped 500, never a bare one
            log.exception("unhandled error on %s", path)
            return error_response(500, f"internal gateway error: {type(e).__name__}", code="internal_error")


    def _refused(self, request: Request, e: GatewayError) -> None:
        """The access line of a request refused before it had a record (a 400, 401, 404, a key's
        429): a record's own errors carry its version header and were logged as it finished."""
        t = self.gateway.telemetry
        if t is None or t.log is None or VERSION_HEADER in e.headers:
            return
        t.access({"time": round(time.time(), 3), "request_id": request.headers.get("x-request-id"),
                  "path": request.url.path, "status": e.status, "error": e.code})


def create_app(config: GatewayConfig, telemetry: GatewayTelemetry | None = None) -> GatewayApp:
    gw = Gateway(config, telemetry=telemetry)
    cards = ModelCards()

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
    app.proxy = Proxy(gw)
    auth = config.auth.client_auth()

    def check_client(request: Request) -> Privileges:
        return auth.identify(request.headers.get("authorization"))

    app.check_client = check_client
    app.frontends = gateway_frontends(app, config, auth.identify, gw.services, gw.observers)

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
        return validation_error_response(e.errors())

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict:
        check_client(request)
        await gw.ensure_started()  # (the instances are asked: the upstream client must exist)
        return model_list(await cards.cards(gw))

    @app.get("/v1/models/{model:path}")  # client.models.retrieve, as an instance answers it
    async def retrieve_model(model: str, request: Request) -> dict:
        check_client(request)
        await gw.ensure_started()
        card = next((c for c in await cards.cards(gw) if c["id"] == model), None)
        if card is None:
            raise GatewayError(404, f"the model {model!r} does not exist", param="model", code="model_not_found")
        return with_anthropic_fields(card)

    # HEAD too: a load balancer's check may send it (HAProxy's http-check, uptime probes).
    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> dict:
        return {"status": "ok"}

    @app.api_route("/ready", methods=["GET", "HEAD"])
    async def ready() -> Response:
        if gw.ready():
            limits = {"limits": gw.tenants.status()} if gw.tenants.limited else {}
            return JSONResponse({"status": "ready", **gw.shared.details(), **limits})
        return error_response(503, "no upstream instance is ready", code="not_ready")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(gw.metrics.exposition(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    app.include_router(admin_router(gw))
    app.include_router(keys_router(gw))
    app.include_router(dashboard_router(gw))
    return app


GRACEFUL_S = 20  # on SIGTERM, in-flight requests get this long to finish before the exit


def bound_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """The port, bound before anything starts: one that is taken (or a host that does not
    resolve) is one line and exit 2, as for the engine, not uvicorn's error after start-up."""
    from llmserve.ports import listen

    try:
        sock = listen(host, port, reuse_port=reuse_port)
    except OSError as e:
        raise ValueError(f"cannot listen on {host}:{port}: {(e.strerror or str(e)).lower()}") from None
    sock.set_inheritable(reuse_port)  # (a replica's, as serve/replicas.py binds it)
    return sock


def run_gateway(config_path: str | Path, host: str = "127.0.0.1", port: int = 8080,
                log_level: str = "info", tracing: TracingConfig | None = None) -> None:
    import uvicorn

    config = GatewayConfig.load(config_path)
    config = config.model_copy(update={"state": config.state.for_port(port)})
    check_store(config.state.redis_url, config.state.redis_password_file)
    sock = bound_socket(host, port)
    from llmserve.tracing.gateway import GatewayTelemetry

    tracing = tracing or TracingConfig()
    telemetry = GatewayTelemetry(start_tracing(tracing), tracing.access_log) \
        if tracing.enabled or tracing.access_log else None
    # The access log is the gateway's own JSON lines (llmserve.tracing), not uvicorn's.
    options = dict(host=host, port=port, log_level=log_level, access_log=False,
                   **uvicorn_options(config.limits.http_limits()),
                   # The gateway never reads the client address, so no X-Forwarded-* rewriting.
                   proxy_headers=False, timeout_graceful_shutdown=GRACEFUL_S)
    uvicorn.Server(uvicorn.Config(create_app(config, telemetry), **options)).run(sockets=[sock])
