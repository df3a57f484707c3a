"""The end of a relayed stream: the response that frees its upstream slot however the
client leaves, and the once-only accounting when a stream ends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Protocol

import httpx
from fastapi.responses import Response

from llmserve.gateway.pool import Lease, Outcome, Pool
from llmserve.gateway.recorder import RequestRecord
from llmserve.gateway.upstream import UpstreamResponse


class Current(Protocol):
    """The upstream a stream relays now; the attempt loop may replace it before the
    first event, so the response reads it only when the stream ends."""

    resp: UpstreamResponse
    lease: Lease


def end_stream(resp: UpstreamResponse, lease: Lease, pool: Pool, ctx: RequestRecord,
                      outcome: Outcome, status: int, kind: str | None) -> None:
    """Free the slot, close the upstream, record the outcome; once per stream."""
    if lease.released:
        return
    pool.release(lease, outcome)
    resp.close()  # synchronous, so a cancellation cannot cut it short
    if outcome is Outcome.NEUTRAL:
        ctx.finish(499, error_kind="client_disconnected", ok=True)
    else:
        ctx.finish(status, error_kind=kind, ok=outcome is Outcome.SUCCESS)


class RelayResponse(Response):
    """A streamed response that frees its upstream slot even when the client is gone
    before the body starts: then the relay never runs, so its own ``finally`` never
    does either.

    Like Starlette's ``StreamingResponse``, it streams while listening for the
    client's disconnect and cancels the stream when the client leaves (the relay then
    closes the upstream, so the engine stops generating), but with two plain asyncio
    tasks: Starlette's anyio task group cost about as much CPU per request as the whole
    relay (its cancel even formats task reprs). ``opening`` is awaited once the head is
    out and gives the body's iterator (the relay itself, so each event passes one
    generator, not a wrapper around it)."""

    def __init__(self, opening: Callable[[], Awaitable[AsyncIterator[bytes]]], *, current: Current, pool: Pool,
                 ctx: RequestRecord, status_code: int, headers: Mapping[str, str]) -> None:
        self.status_code, self.background = status_code, None
        self.init_headers(headers)
        self._open = opening
        self._cleanup = (current, pool, ctx)

    async def _send_body(self, send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for chunk in await self._open():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _gone(receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    async def __call__(self, scope, receive, send) -> None:
        stream = asyncio.ensure_future(self._send_body(send))
        gone = asyncio.ensure_future(self._gone(receive))
        try:
            await asyncio.wait((stream, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            stream.cancel()  # a no-op once it is done
            try:
                await asyncio.wait((stream,))  # let the relay's own cleanup finish
            finally:
                current, pool, ctx = self._cleanup
                end_stream(current.resp, current.lease, pool, ctx, Outcome.NEUTRAL, 499, None)
                # Gone while a retry was being sent: the lease above was already released.
                ctx.finish(499, error_kind="client_disconnected", ok=True)  # once-only
            error = stream.exception() if stream.done() and not stream.cancelled() else None
        if error is not None:
            raise error


def renaming(upstream: str, client: str | None) -> tuple[tuple[bytes, bytes], ...]:
    """The byte replacements that put the client's model name where the upstream wrote its own,
    in either JSON spacing (llama.cpp answers with the GGUF path it was started with)."""
    if not client or client == upstream:
        return ()
    old, new = json.dumps(upstream).encode(), json.dumps(client).encode()
    return tuple((b'"model"' + sep + old, b'"model"' + sep + new) for sep in (b":", b": "))


def renamed(data: bytes, pairs: tuple[tuple[bytes, bytes], ...]) -> bytes:
    for old, new in pairs:
        data = data.replace(old, new)
    return data


async def one_event(event: bytes) -> AsyncIterator[bytes]:
    """A body of one event (a stream that failed before its first one)."""
    yield event


async def first_bytes(resp: UpstreamResponse, lease: Lease, pool: Pool) -> tuple[bytes, AsyncIterator[bytes]] | str:
    """A stream's first bytes and the rest; or, when it breaks or ends before them, why
    (the upstream closed, its lease released as a failure)."""
    chunks = resp.aiter_raw()
    try:
        return await anext(chunks), chunks
    except (httpx.HTTPError, StopAsyncIteration) as e:
        resp.close()
        pool.release(lease, Outcome.FAILURE)
        return type(e).__name__


def last_event_end(buf: bytes) -> int:
    """Index just past the last complete SSE event in ``buf`` (0 if none)."""
    a, b = buf.rfind(b"\n\n"), buf.rfind(b"\r\n\r\n")
    return max(a + 2 if a >= 0 else 0, b + 4 if b >= 0 else 0)


def is_sse(resp: UpstreamResponse) -> bool:
    return resp.headers.get("content-type", "").startswith("text/event-stream")
