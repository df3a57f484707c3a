"""The gateway's HTTP client for the request path and the monitor's ``/load`` and
``/ready`` polls, on aiohttp's client (llhttp parser, keep-alive connection pool).

httpx/httpcore cost several CPU milliseconds per proxied request on a small machine
(anyio streams, a per-request scan of every pooled connection, one h11 event and a
timeout scope per body chunk); the gateway proxies every token of every stream, so
that cost is its ceiling. aiohttp's client does the same work in C for the parsing
and with plain asyncio for the rest.

This module keeps the interface the gateway was written against: ``post`` returns
once the response head is in, the body is streamed (``aiter_raw``) or read whole
(``aread``), ``aclose`` returns the connection to the pool (or closes it, when the
body was not read to its end). Errors are raised as ``httpx`` exceptions
(``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``, ``RemoteProtocolError``,
``ReadError``, ``LocalProtocolError``), so callers keep one ``except httpx.HTTPError``
and the proxy's retry-before-the-first-byte rule sees the same failures as before.

No proxies from the environment, no redirects, no cookies, no content decoding
(the proxy asks for ``identity`` and relays bytes as they are).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import contextmanager

import aiohttp
import httpx
from aiohttp import connector as _connector
from yarl import URL

# enable_cleanup_closed works around a CPython leak of aborted SSL transports; aiohttp
# warns and ignores it on the Python versions where that is fixed.
_CLEANUP_CLOSED = getattr(_connector, "NEEDS_CLEANUP_CLOSED", True)
_ConnectionTimeout = getattr(aiohttp, "ConnectionTimeoutError", None)


@contextmanager
def _mapped_errors():
    """aiohttp's exceptions → the httpx ones the gateway's callers handle."""
    try:
        yield
    except httpx.HTTPError:
        raise
    except asyncio.CancelledError:
        raise
    except aiohttp.ClientError as e:
        raise _map(e) from e
    except TimeoutError as e:  # asyncio.TimeoutError is TimeoutError on 3.11+
        raise httpx.ReadTimeout(str(e) or "the upstream did not answer in time") from e


def _map(e: aiohttp.ClientError) -> httpx.HTTPError:
    msg = str(e) or type(e).__name__
    if _ConnectionTimeout is not None and isinstance(e, _ConnectionTimeout):
        return httpx.ConnectTimeout(msg)
    if isinstance(e, aiohttp.ServerTimeoutError):
        return httpx.ReadTimeout(msg)
    if isinstance(e, aiohttp.ClientConnectorError):
        return httpx.ConnectError(msg)
    if isinstance(e, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError,
                      aiohttp.ClientResponseError)):
        # A close before or inside the response, or a response llhttp refused.
        return httpx.RemoteProtocolError(msg)
    if isinstance(e, aiohttp.InvalidURL):
        return httpx.UnsupportedProtocol(msg)
    if isinstance(e, aiohttp.ClientOSError):
        return httpx.ReadError(msg)
    return httpx.TransportError(msg)


class UpstreamResponse:
    """A response whose body is read on demand; ``aclose`` returns the connection."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status_code = resp.status
        # A plain dict with lower-case names (repeated headers joined with ", "), as
        # callers read and copy it; they never see aiohttp's multidict.
        headers: dict[str, str] = {}
        for k, v in resp.headers.items():
            k = k.lower()
            headers[k] = f"{headers[k]}, {v}" if k in headers else v
        self.headers = headers
        self._content = resp.content
        self._closed = False

    def aiter_raw(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (a plain iterator: nothing to finalise if dropped)."""
        return self

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        with _mapped_errors():
            data = await self._content.readany()
        if not data:
            raise StopAsyncIteration
        return data

    async def aread(self) -> bytes:
        with _mapped_errors():
            return await self._content.read()

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._content.is_eof():
            self._resp.release()  # the whole body is in: the connection may be reused
        else:
            self._resp.close()  # mid-body: the rest of the response is unwanted


class UpstreamClient:
    """Keep-alive connections per upstream origin (one aiohttp session).

    ``post`` sends and returns once the head is in (the body is streamed); ``get``
    reads a whole small answer (the monitor's polls). ``timeout`` overrides the
    connect and read timeouts for one call."""

    def __init__(self, *, connect_timeout: float, read_timeout: float,
                 keepalive_expiry: float = 30.0) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout  # for each wait on the upstream, as httpx's read timeout
        self.keepalive_expiry = keepalive_expiry
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[float | None, aiohttp.ClientTimeout] = {}
        self._urls: dict[str, URL] = {}

    def _get_session(self) -> aiohttp.ClientSession:
        # Made on first use, inside the running loop the gateway serves on.
        s = self._session
        if s is None or s.closed:
            conn = aiohttp.TCPConnector(limit=0, limit_per_host=0,
                                        keepalive_timeout=self.keepalive_expiry,
                                        enable_cleanup_closed=_CLEANUP_CLOSED,
                                        force_close=False, ttl_dns_cache=300)
            s = self._session = aiohttp.ClientSession(
                connector=conn, auto_decompress=False, trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(), timeout=self._timeout(None),
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"))
        return s

    def _timeout(self, timeout: float | None) -> aiohttp.ClientTimeout:
        t = self._timeouts.get(timeout)
        if t is None:
            connect = self.connect_timeout if timeout is None else timeout
            read = self.read_timeout if timeout is None else timeout
            t = self._timeouts[timeout] = aiohttp.ClientTimeout(
                total=None, sock_connect=connect, sock_read=read)
        return t

    def _url(self, url: str) -> URL:
        u = self._urls.get(url)
        if u is None:
            u = URL(url)
            if u.scheme not in ("http", "https") or not u.host:
                raise httpx.UnsupportedProtocol(f"cannot send to {url!r}")
            if len(self._urls) < 4096:
                self._urls[url] = u
        return u

    async def post(self, url: str, content: bytes, headers: dict[str, str], *,
                   timeout: float | None = None) -> UpstreamResponse:
        return await self._send("POST", url, content, headers, timeout)

    async def get(self, url: str, *, timeout: float | None = None) -> tuple[int, bytes]:
        """Status and whole body of a GET."""
        resp = await self._send("GET", url, None, {}, timeout)
        try:
            return resp.status_code, await resp.aread()
        finally:
            await resp.aclose()

    async def _send(self, method: str, url: str, content: bytes | None,
                    headers: dict[str, str], timeout: float | None) -> UpstreamResponse:
        u = self._url(url)
        for k, v in headers.items():
            if "\r" in v or "\n" in v or "\0" in v:
                raise httpx.LocalProtocolError(f"header {k!r} has a line break")
        session = self._get_session()
        tmo = self._timeout(timeout)
        # No resend here: a POST the upstream may already have received must not run
        # twice behind the proxy's back (its retry, on another instance, is budgeted
        # and counted). Stale kept-alive connections are avoided instead by expiring
        # them before the upstream does (see keepalive_expiry).
        with _mapped_errors():
            resp = await session.request(method, u, data=content, headers=headers, timeout=tmo,
                                         allow_redirects=False)
        return UpstreamResponse(resp)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
