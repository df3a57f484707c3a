"""A non-streaming request's work, cancelled as soon as its client goes away."""

from __future__ import annotations

import asyncio

from fastapi import Request

from llmserve.api.errors import APIError


async def until_disconnect(raw: Request, coro):
    """Run ``coro`` but cancel it as soon as the client goes away (non-streaming requests).

    The body is read by now, so the next ASGI message can only be the disconnect:
    one task waits for it (polling ``Request.is_disconnected`` instead costs a
    wake-up per interval and adds up to that interval to every abort)."""
    task = asyncio.ensure_future(coro)
    gone = asyncio.ensure_future(_disconnected(raw.receive))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            raise APIError(499, "client disconnected", "invalid_request_error")
        return task.result()
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
