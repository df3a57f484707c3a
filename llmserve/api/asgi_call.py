"""Call an ASGI app in process: how /v1/responses, /v1/messages and batch lines
reach the one chat-completions path of an instance or the gateway.

The inner request is the caller's own scope with another path and body, so the
app sees the same headers (API key, priority, request id) and runs its normal
validation, admission, balancing and metrics. The reply is read as it is sent:
``status`` and ``headers`` once the head is in, then ``chunks()`` yields body bytes
as the app writes them (an SSE stream is relayed event by event, not buffered).
A client that leaves the outer request is passed on as ``http.disconnect``, so
the inner request is aborted as it would be for a direct client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope

from llmserve.api.parse import load_json


class InnerResponse:
    """One in-process request's reply; close it (or read it to the end) to free the task."""

    def __init__(self, task: asyncio.Task, messages: asyncio.Queue) -> None:
        self._task, self._messages = task, messages
        self.status = 500
        self.headers: dict[str, str] = {}
        self._done = False

    async def _start(self) -> None:
        msg = await self._next()
        if msg is None:
            raise RuntimeError("the app ended without a response")
        self.status = msg["status"]
        self.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in msg.get("headers", [])}

    async def _next(self) -> Message | None:
        get = asyncio.ensure_future(self._messages.get())
        await asyncio.wait((get, self._task), return_when=asyncio.FIRST_COMPLETED)
        if get.done():
            return get.result()
        get.cancel()
        if self._messages.empty():
            self._task.result()  # raises what the app raised
            return None
        return self._messages.get_nowait()

    @property
    def is_stream(self) -> bool:
        return self.headers.get("content-type", "").startswith("text/event-stream")

    async def chunks(self) -> AsyncIterator[bytes]:
        while not self._done:
            msg = await self._next()
            if msg is None:
                break
            if msg.get("body"):
                yield msg["body"]
            if not msg.get("more_body", False):
                self._done = True
        await self.close()

    async def read(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    async def json(self) -> Any:
        raw = await self.read()
        try:
            return load_json(raw)
        except Exception:  # noqa: BLE001 - a non-JSON body (a proxy's HTML page): say so plainly
            return {"error": {"message": raw[:200].decode("utf-8", "replace"), "type": "upstream_error",
                              "param": None, "code": None}}

    async def events(self) -> AsyncIterator[Any]:
        """An SSE body's ``data:`` payloads as JSON (``[DONE]`` ends it)."""
        buf = b""
        async for chunk in self.chunks():
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if line.startswith(b"data:"):
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            return
                        yield json.loads(data)

    async def close(self) -> None:
        self._done = True
        if not self._task.done():
            self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task


async def call(app: ASGIApp, scope: Scope, path: str, body: dict[str, Any], *,
               method: str = "POST", outer_receive: Receive | None = None,
               extra: dict[str, Any] | None = None) -> InnerResponse:
    """POST ``body`` (JSON) to ``path`` of ``app`` with ``scope``'s headers; ``extra``
    adds scope keys (never client-settable, e.g. the batch runner's privileges)."""
    data = json.dumps(body).encode()
    headers = [(k, v) for k, v in scope.get("headers", []) if k not in (b"content-length", b"content-type")]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    inner = {**scope, "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": headers, **(extra or {})}
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": data, "more_body": False}
        if outer_receive is not None:
            while True:
                msg = await outer_receive()
                if msg["type"] == "http.disconnect":
                    return msg
        await asyncio.Event().wait()  # nobody to leave: wait until cancelled
        raise AssertionError("unreachable")

    messages: asyncio.Queue = asyncio.Queue(maxsize=64)  # back-pressure: a slow reader slows the app

    async def send(msg: Message) -> None:
        await messages.put(msg)

    task = asyncio.create_task(app(inner, receive, send))
    resp = InnerResponse(task, messages)
    try:
        await resp._start()
    except BaseException:
        await resp.close()
        raise
    return resp
