"""Before the run: the served model's name, and one untimed test request.

As ``vllm bench serve`` does, a server that is not up yet is waited for, up to
``--ready-check-timeout-sec`` (600 s, vLLM's default), so ``llmserve engine & llmserve
bench ...`` works: a refused connection, or a 502/503/504 from a server still loading
or warming up, is tried again every second. Anything else (a 400 for the flags' request,
a 401, a 500) stops the run at once with one line, since waiting cannot fix it; so does
a server still not ready at the deadline. 0 tries once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import httpx

from llmserve.bench.client import EndpointConfig, make_http_client, send_request
from llmserve.bench.records import ErrorKind

if TYPE_CHECKING:
    from llmserve.bench.datasets import SampleRequest

NOT_READY_STATUS = frozenset({502, 503, 504})  # a proxy before a starting server, or one warming up
RETRY_EVERY_S = 1.0
T = TypeVar("T")


class NotReady(Exception):
    """The server is not answering yet; worth another try before the deadline."""


def unreachable(url: str, e: BaseException) -> str:
    """``cannot reach URL: connection refused``: the URL, and the reason without errno noise."""
    reason = getattr(e, "strerror", None) or str(e.__cause__ or e.__context__ or e) or type(e).__name__
    return f"cannot reach {url}: {reason.split('] ')[-1].lower()}"


def until_ready(attempt: Callable[[], T], timeout_s: float, url: str,
                say: Callable[[str], None] | None = None, since: float | None = None) -> T:
    """``attempt()`` until it returns; :class:`NotReady` is retried until ``timeout_s`` has
    passed since ``since`` (a ``time.monotonic()``; default now), then re-raised as a
    ValueError with its message; any other error is not."""
    deadline = (time.monotonic() if since is None else since) + timeout_s
    waiting = False
    while True:
        try:
            return attempt()
        except NotReady as e:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ValueError(f"{e} (waited {timeout_s:g} s; --ready-check-timeout-sec)" if waiting
                                 else str(e)) from None
            if not waiting and say is not None:
                say(f"Waiting up to {timeout_s:g} s for {url} to be ready ({e})")
            waiting = True
            time.sleep(min(RETRY_EVERY_S, left))


def first_served_model(endpoint: EndpointConfig, say: Callable[[str], None] | None = None) -> str:
    """The first model of ``GET /v1/models``, waiting for the server as the test request does."""
    url = endpoint.api_root + "/models"

    def ask() -> str:
        try:
            with httpx.Client(trust_env=False, timeout=30) as c:
                resp = c.get(url, headers=endpoint.headers)
        except (httpx.TransportError, OSError) as e:
            raise NotReady(unreachable(url, e)) from None
        if resp.status_code in NOT_READY_STATUS:
            raise NotReady(f"GET {url} answered HTTP {resp.status_code}")
        if resp.status_code != 200:
            raise ValueError(f"GET {url} answered HTTP {resp.status_code}: {resp.text[:200]}; pass --model")
        try:
            models = resp.json().get("data") or []
        except (ValueError, AttributeError):
            raise ValueError(f"GET {url} answered something that is not a model list; pass --model") from None
        if not models:
            raise ValueError(f"{url} lists no model; pass --model")
        return models[0]["id"]

    return until_ready(ask, endpoint.ready_check_timeout_s, url, say)


def initial_test(endpoint: EndpointConfig, probe: SampleRequest, say: Callable[[str], None] | None = None,
                 since: float | None = None) -> None:
    """One request before the run, as ``vllm bench serve`` sends: a server that is down or
    refuses the request stops the run with one line, not a table of failures. ``since``: when
    the wait began (the model list's wait before it counts against the same timeout)."""

    async def one():
        async with make_http_client(1) as client:
            return await send_request(client, endpoint, probe, -1, time.perf_counter())

    def attempt() -> None:
        rec = asyncio.run(one())
        if rec.success:
            return
        if rec.error_kind is ErrorKind.CONNECTION:
            why = ConnectionError(rec.error.split(": ", 1)[-1])  # the message, not its class name
            raise NotReady(f"{unreachable(endpoint.url, why)} (the initial test request)")
        failed = f"the initial test request to {endpoint.url} failed: {' '.join(rec.error.split())[:300]}"
        if rec.http_status in NOT_READY_STATUS:
            raise NotReady(failed)
        raise ValueError(failed)

    until_ready(attempt, endpoint.ready_check_timeout_s, endpoint.url, say, since)
