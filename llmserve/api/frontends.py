"""The APIs beside chat completions, one ASGI front shared by an instance and the gateway.

``Frontends`` answers ``/v1/responses`` (POST, GET and DELETE ``/{id}``) and
``/v1/messages`` by translating them onto the host's ``/v1/chat/completions``
(``asgi_call``), so both hosts keep one engine path and one set of checks; the
gateway adds ``/v1/files`` and ``/v1/batches`` through ``extra``. Anthropic's
``x-api-key`` is read as ``Authorization: Bearer`` so its SDK uses the same keys.
A stored response belongs to the key that made it (a digest of it, never the key).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from llmserve.api import messages, responses
from llmserve.api.asgi_call import call
from llmserve.api.errors import APIError, error_body
from llmserve.api.limits import bearer_token, body_too_large, find_key
from llmserve.api.messages_protocol import MessagesRequest
from llmserve.api.parse import parse_model
from llmserve.api.response_store import ResponseStore, StoredResponse
from llmserve.api.responses_protocol import ResponsesRequest

log = logging.getLogger(__name__)

Authorize = Callable[[str | None], Any]  # Authorization header -> anything; raises APIError (401)
Route = Callable[[Scope, Receive, bytes], Awaitable[Response]]
# An in-process caller that has already authorized the request (the batch runner) names
# its owner here; a scope key, so no HTTP client can set it.
OWNER_KEY = "llmserve.owner"
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def keys_authorizer(keys: list[str]) -> Authorize:
    """An instance's check: one of its ``--api-key`` values, or anything when it has none."""
    allowed = [k.encode() for k in keys]

    def check(authorization: str | None) -> None:
        if allowed and find_key(bearer_token(authorization), allowed) is None:
            raise APIError(401, "invalid or missing API key", "authentication_error", code="invalid_api_key")
    return check


def with_api_key(scope: Scope) -> Scope:
    """``x-api-key: K`` (Anthropic's SDK) as ``Authorization: Bearer K`` when none is given."""
    headers = scope.get("headers", [])
    key = next((v for k, v in headers if k == b"x-api-key"), None)
    if key is None or any(k == b"authorization" for k, _ in headers):
        return scope
    return {**scope, "headers": [*headers, (b"authorization", b"Bearer " + key)]}


def header(scope: Scope, name: bytes) -> str | None:
    v = next((v for k, v in scope.get("headers", []) if k == name), None)
    return None if v is None else v.decode("latin-1")


async def read_body(receive: Receive, limit: int) -> bytes:
    body = b""
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise APIError(499, "the client closed the request", code="client_disconnected")
        body += msg.get("body", b"")
        if len(body) > limit:
            raise body_too_large(limit)
        if not msg.get("more_body", False):
            return body


class Frontends:
    """ASGI in front of ``app``; ``chat`` is the app whose chat route does the work (often ``app``)."""

    def __init__(self, app: ASGIApp, store: ResponseStore, authorize: Authorize, max_body_bytes: int, *,
                 chat: ASGIApp | None = None, extra: dict[str, Route] | None = None,
                 extra_body_bytes: int | None = None) -> None:
        self.app, self.chat = app, chat or app
        self.store, self.authorize, self.max_body_bytes = store, authorize, max_body_bytes
        self.extra = extra or {}  # path prefix -> handler (the gateway's files and batches)
        self.extra_body_bytes = extra_body_bytes or max_body_bytes  # an uploaded file may be larger

    def handles(self, path: str) -> bool:
        return path.startswith(("/v1/messages", "/v1/responses")) or \
            any(path == p or path.startswith(p + "/") for p in self.extra)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.handles(scope["path"]):
            return await self.app(scope, receive, send)
        scope = with_api_key(scope)
        anthropic = scope["path"].startswith("/v1/messages")
        try:
            response = await self._route(scope, receive)
        except APIError as e:
            body = messages.error_body(e.status, e.message) if anthropic else e.body()
            response = JSONResponse(body, status_code=e.status, headers=e.headers)
        except Exception as e:  # noqa: BLE001 - a shaped 500, never a bare one
            log.exception("unhandled error on %s", scope["path"])
            msg = f"internal error: {type(e).__name__}"
            response = JSONResponse(messages.error_body(500, msg) if anthropic else error_body(msg, "server_error"),
                                    status_code=500)
        await response(scope, receive, send)

    async def _route(self, scope: Scope, receive: Receive) -> Response:
        path, method = scope["path"], scope["method"]
        for prefix, route in self.extra.items():
            if path == prefix or path.startswith(prefix + "/"):
                self.authorize(header(scope, b"authorization"))
                body = await read_body(receive, self.extra_body_bytes) if method == "POST" else b""
                return await route(scope, receive, body)
        if path == "/v1/messages":
            _only(method, "POST", path)
            return await self._messages(scope, receive)
        if path.startswith("/v1/messages"):  # (count_tokens, batches: Anthropic's, not served)
            raise APIError(404, f"{path} is not supported", code="not_found")
        if path != "/v1/responses" and not path.startswith("/v1/responses/"):
            raise APIError(404, f"{path} is not supported", code="not_found")
        if path == "/v1/responses":
            _only(method, "POST", path)
            return await self._create_response(scope, receive)
        return await self._stored(scope, path.removeprefix("/v1/responses/"), method)

    # ---- /v1/responses -------------------------------------------------------------------
    def _owner(self, scope: Scope) -> str:
        if scope.get(OWNER_KEY):
            return scope[OWNER_KEY]
        self.authorize(header(scope, b"authorization"))
        return hashlib.sha256(bearer_token(header(scope, b"authorization"))).hexdigest()

    async def _stored(self, scope: Scope, rid: str, method: str) -> Response:
        owner = self._owner(scope)
        if "/" in rid or rid in _NOT_SERVED:  # (input_items, cancel; input_tokens, compact: not response ids)
            raise APIError(404, f"{method} {scope['path']} is not supported", code="not_found")
        if method not in ("GET", "DELETE"):
            raise APIError(405, f"{method} {scope['path']} is not supported", code="method_not_allowed",
                           headers={"allow": "GET, DELETE"})
        query = sorted(parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True))
        if query:  # include, stream (a stored stream's replay), starting_after: not implemented
            raise APIError(400, f"query parameter {query[0]!r} is not supported on {scope['path']}", param=query[0])
        rec = await self.store.get(rid)
        if rec is None or rec.owner != owner:
            raise APIError(404, f"no stored response with id {rid!r}", param="response_id", code="not_found")
        if method == "DELETE":
            await self.store.delete(rid)
            return JSONResponse({"id": rid, "object": "response", "deleted": True})
        return JSONResponse(rec.response)

    async def _create_response(self, scope: Scope, receive: Receive) -> Response:
        req = parse_model(await read_body(receive, self.max_body_bytes), ResponsesRequest)
        owner = self._owner(scope)
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            prev = await self.store.get(req.previous_response_id)
            if prev is None or prev.owner != owner:
                raise APIError(404, f"previous response {req.previous_response_id!r} not found (it was not "
                               "stored, or was deleted)", param="previous_response_id", code="not_found")
            history = prev.messages
        new = responses.input_messages(req)
        inner = await call(self.chat, scope, "/v1/chat/completions", responses.chat_body(req, history, new),
                           outer_receive=receive)
        if inner.status != 200:
            return JSONResponse(await inner.json(), status_code=inner.status, headers=_relayed(inner.headers))
        env = responses.Envelope(req, None)

        async def keep(obj: dict[str, Any]) -> None:
            if req.store:
                conversation = history + new + [responses.assistant_message(obj["output"])]
                await self.store.put(StoredResponse(obj["id"], owner, obj, conversation, obj["created_at"]))

        if not req.stream:
            obj = responses.from_chat(env, await inner.json())
            await keep(obj)
            return JSONResponse(obj, headers=_relayed_ok(inner.headers))
        stream = responses.EventStream(env)

        async def events():
            try:
                async for e in stream.run(inner.events()):
                    yield e
                if stream.response is not None:
                    await keep(stream.response)
                    yield stream.final_event()
            finally:
                await inner.close()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={**_SSE_HEADERS, **_relayed_ok(inner.headers)})

    # ---- /v1/messages ----------------------------------------------------------------------
    async def _messages(self, scope: Scope, receive: Receive) -> Response:
        req = parse_model(await read_body(receive, self.max_body_bytes), MessagesRequest)
        inner = await call(self.chat, messages.thinking_scope(scope, req), "/v1/chat/completions",
                           messages.chat_body(req), outer_receive=receive)
        if inner.status != 200:
            return JSONResponse(messages.from_openai_error(inner.status, await inner.json()), status_code=inner.status,
                                headers=_relayed(inner.headers))
        if not req.stream:
            return JSONResponse(messages.from_chat(req, await inner.json()), headers=_relayed_ok(inner.headers))

        async def events():
            try:
                async for e in messages.stream_events(req, inner.events()):
                    yield e
            finally:
                await inner.close()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={**_SSE_HEADERS, **_relayed_ok(inner.headers)})


_NOT_SERVED = frozenset({"input_tokens", "compact"})  # OpenAI's POST /v1/responses/<these>


def _relayed(headers: dict[str, str]) -> dict[str, str]:
    """The inner error's headers a client acts on: Retry-After (a 429's or 503's backoff)
    and rate-limit state; the body's framing is the new response's own."""
    return {k: v for k, v in headers.items() if k == "retry-after" or k.startswith(("x-ratelimit-", "ratelimit-"))}


def _relayed_ok(headers: dict[str, str]) -> dict[str, str]:
    """A 200's headers from the chat route that a chat answer carries: the gateway's rate-limit
    state, x-llmserve-* (version, upstream, priority), x-request-id and Server-Timing."""
    return {k: v for k, v in headers.items() if k in ("x-request-id", "server-timing")
            or k.startswith(("x-ratelimit-", "ratelimit-", "x-llmserve-"))}


def _only(method: str, allowed: str, path: str) -> None:
    if method != allowed:
        raise APIError(405, f"{path} takes {allowed}", code="method_not_allowed", headers={"allow": allowed})
