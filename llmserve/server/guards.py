"""Request-level guards in front of the instance's routes: the API key and the body size.

Plain ASGI wrappers, not ``@app.middleware``: Starlette's ``BaseHTTPMiddleware``
runs the app in a task group and wraps ``receive``, and through it a handler can
no longer see its client leave (``Request.is_disconnected`` always answered False),
so a non-streaming request outlived its client. Connection-level limits (header
and URL size, read timeouts) are the HTTP protocol's: ``llmserve.http_guard``.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmserve.api.errors import error_body
from llmserve.api.limits import bearer_token, body_too_large, declared_over, find_key

_KEYED_PATHS = ("/v1/", "/tokenize", "/detokenize", "/engine/")


class ApiKeyAuth:
    """401 unless ``Authorization: Bearer <one of keys>`` (no keys: everything passes)."""

    def __init__(self, app: ASGIApp, keys: list[str]) -> None:
        self.app = app
        self.keys = [k.encode() for k in keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.keys and scope["type"] == "http" and scope["path"].startswith(_KEYED_PATHS):
            header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if find_key(bearer_token(header), self.keys) is None:
                return await _send_json(send, 401, error_body("invalid or missing API key", "authentication_error",
                                                              None, "invalid_api_key"))
        await self.app(scope, receive, send)


class BodyLimit:
    """Reject bodies over ``limit`` bytes with 413, by header and while streaming."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if declared_over(scope.get("headers", []), self.limit):
            return await _send_json(send, 413, body_too_large(self.limit).body())
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise body_too_large(self.limit)
            return msg

        await self.app(scope, limited, send)


async def _send_json(send: Send, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
