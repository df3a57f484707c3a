"""The gateway's HTTP/1.1 client to its upstreams: the proxied requests and the
monitor's ``/load`` and ``/ready`` polls.

Responses are parsed by httptools (llhttp, the parser uvicorn and aiohttp use);
this module only keeps connections and hands bytes over. It does what the
gateway needs and nothing else: one write per request, the head returned as soon
as it is in, body bytes handed over as they arrive (read-side backpressure), keep-
alive connections reused per upstream.

Why not aiohttp's client, which the gateway used before: on this 2-core machine it
cost ~0.5 ms of the ~1.8 ms the gateway added to a single request's first token
(its request object, multidicts, tracing hooks, a writer task per request and a
timer re-armed per body chunk), measured with the same harness against a tiny
engine. httpx costs more again.

Errors are raised as ``httpx`` exceptions (``ConnectError``, ``ConnectTimeout``,
``ReadTimeout``, ``RemoteProtocolError``, ``LocalProtocolError``,
``UnsupportedProtocol``), so callers keep one ``except httpx.HTTPError``. A POST is
never resent here: the upstream may have acted on it; the proxy's retry, on
another instance, is budgeted and counted. Stale kept-alive connections are
avoided instead by expiring them before the upstream does.

No proxies from the environment, no redirects, no cookies, no content decoding
(the proxy asks for ``identity`` and relays bytes as they are).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools
import httpx

_HIGH_WATER = 256 * 1024  # unread body bytes before the socket stops being read
_MAX_HEAD = 64 * 1024  # status line and headers together


def unreachable(e: BaseException) -> bool:
    """Whether a send that failed says nothing listens there now: refused, or the connection
    dropped before any answer (a killed instance's kept-alive one). A live instance that
    closed an idle connection just then is marked so too, until its next /ready poll."""
    return isinstance(e, (httpx.ConnectError, httpx.RemoteProtocolError))


class Abandoned(Exception):
    """The caller gave up on the response (its own client left); not an upstream fault."""


class _Conn(asyncio.Protocol):
    """One connection; feeds the response being read, if any, from its bytes."""

    def __init__(self, key: tuple) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.response: UpstreamResponse | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        resp = self.response
        if resp is None or resp.complete:  # bytes nobody asked for: unusable
            self.close()
            return
        try:
            self.parser.feed_data(data)  # type: ignore[union-attr]
        except httptools.HttpParserError as e:
            if not resp.complete:  # else: bytes past the end of a whole response
                resp.fail(httpx.RemoteProtocolError(f"malformed response from the upstream: {e}"))
            self.close()

    def eof_received(self) -> bool | None:
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        resp = self.response
        if resp is not None and not resp.complete:
            if resp.until_close:
                resp.on_message_complete()  # a body framed by the close itself
            else:
                resp.fail(httpx.RemoteProtocolError(
                    "the upstream closed the connection before the response was complete"))

    def pause(self) -> None:
        if not self.paused and not self.closed:
            self.paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]

    def resume(self) -> None:
        if self.paused and not self.closed:
            self.paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _time_out(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(httpx.ReadTimeout("the upstream did not answer in time"))


class UpstreamResponse:
    """A response whose body is read on demand; ``close`` returns the connection to
    the pool when the body was read to its end, and closes it otherwise.

    It is also the parser's callback object (``on_header`` and friends)."""

    def __init__(self, client: UpstreamClient, conn: _Conn, read_timeout: float,
                 abandon: asyncio.Future | None = None) -> None:
        self._client, self._conn, self._read_timeout = client, conn, read_timeout
        self._abandon = abandon
        if abandon is not None:
            abandon.add_done_callback(self._abandoned)
        self.status_code = 0
        self.headers: dict[str, str] = {}
        self.head_done = self.complete = self.until_close = False
        self._interim = False
        self._head_bytes = 0
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        self._keep_alive = False
        self._closed = False

    # ---- parser callbacks -------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.complete:
            raise httptools.HttpParserError("bytes after the end of the response")
        self.headers = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > _MAX_HEAD:
            raise httptools.HttpParserError("response head over 64 KiB")
        k, v = name.decode("latin-1").lower(), value.decode("latin-1")
        h = self.headers
        h[k] = f"{h[k]}, {v}" if k in h else v

    def on_headers_complete(self) -> None:
        status = self._conn.parser.get_status_code()  # type: ignore[union-attr]
        if 100 <= status < 200:  # interim (100 Continue, 103 Early Hints): skip it
            self._interim = True
            return
        self.status_code = status
        h = self.headers
        self.until_close = ("content-length" not in h and "chunked" not in
                            h.get("transfer-encoding", "").lower() and status not in (204, 304))
        self.head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(bytes(body))
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER:
            self._conn.pause()
        self._wake()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._keep_alive = not self.until_close and self._conn.parser.should_keep_alive()  # type: ignore[union-attr]
        self.complete = True
        self._wake()

    # ---- the reader side ----------------------------------------------------------------
    def _abandoned(self, fut: asyncio.Future) -> None:
        if not fut.cancelled():  # cancelled: the caller is done with its watch, not gone
            self.fail(Abandoned("the response was abandoned"))

    def fail(self, exc: BaseException) -> None:
        if self._exc is None:
            self._exc = exc
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _wait(self) -> None:
        loop = asyncio.get_running_loop()
        fut = self._waiter = loop.create_future()
        timer = loop.call_later(self._read_timeout, _time_out, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self._waiter = None

    async def read_head(self) -> None:
        while not self.head_done:
            if self._exc is not None:
                raise self._exc
            await self._wait()

    def aiter_raw(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (a plain iterator: nothing to finalise if dropped)."""
        return self

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        while not self._chunks:
            if self._exc is not None:  # after the bytes that came before it
                raise self._exc
            if self.complete:
                raise StopAsyncIteration
            await self._wait()
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        self._conn.resume()
        return data

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self])

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._abandon is not None:
            self._abandon.remove_done_callback(self._abandoned)
        conn = self._conn
        conn.response = conn.parser = None
        if self.complete and self._keep_alive and self._exc is None and not conn.closed:
            self._client._put_back(conn)
        else:
            conn.close()


class UpstreamClient:
    """Keep-alive connections per upstream origin.

    ``post`` sends and returns once the head is in (the body is streamed); ``get``
    reads a whole small answer (the monitor's polls). ``timeout`` overrides the
    connect and read timeouts for one call; the read timeout bounds each wait on
    the upstream, as httpx's does."""

    def __init__(self, *, connect_timeout: float, read_timeout: float,
                 keepalive_expiry: float = 30.0) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.keepalive_expiry = keepalive_expiry
        self._idle: dict[tuple, list[_Conn]] = {}
        self._targets: dict[str, tuple[tuple, bytes]] = {}
        self._ssl: ssl.SSLContext | None = None

    async def post(self, url: str, content: bytes, headers: dict[str, str], *,
                   timeout: float | None = None, abandon: asyncio.Future | None = None) -> UpstreamResponse:
        """``abandon``: once it is done, waits on this response raise ``Abandoned`` (and
        closing it closes the connection, which tells the upstream to stop)."""
        return await self._send(b"POST", url, content, headers, timeout, abandon)

    async def get(self, url: str, *, timeout: float | None = None,
                  headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """Status and whole body of a GET."""
        resp = await self._send(b"GET", url, None, headers or {}, timeout)
        try:
            return resp.status_code, await resp.aread()
        finally:
            resp.close()

    async def _send(self, method: bytes, url: str, content: bytes | None,
                    headers: dict[str, str], timeout: float | None,
                    abandon: asyncio.Future | None = None) -> UpstreamResponse:
        key, head = self._target(url)
        parts = [method, b" ", head]
        if content is not None:
            parts.append(b"content-length: %d\r\n" % len(content))
        for k, v in headers.items():
            if "\r" in v or "\n" in v or "\0" in v or "\r" in k or "\n" in k or ":" in k:
                raise httpx.LocalProtocolError(f"header {k!r} cannot be sent as it is")
            try:
                parts.append(f"{k}: {v}\r\n".encode("latin-1"))
            except UnicodeEncodeError:
                raise httpx.LocalProtocolError(f"header {k!r} is not latin-1") from None
        parts.append(b"\r\n")
        if content:
            parts.append(content)
        conn = self._take(key) or await self._connect(key, timeout or self.connect_timeout)
        resp = UpstreamResponse(self, conn, timeout or self.read_timeout, abandon)
        conn.response = resp
        conn.parser = httptools.HttpResponseParser(resp)
        try:
            conn.transport.write(b"".join(parts))  # type: ignore[union-attr]
            await resp.read_head()
        except BaseException:
            resp.close()
            raise
        return resp

    def _target(self, url: str) -> tuple[tuple, bytes]:
        """(pool key, request-target + Host line) for a URL, memoised."""
        t = self._targets.get(url)
        if t is None:
            u = urlsplit(url)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise httpx.UnsupportedProtocol(f"cannot send to {url!r}")
            port = u.port or (443 if u.scheme == "https" else 80)
            target = (u.path or "/") + (f"?{u.query}" if u.query else "")
            host = u.netloc.rpartition("@")[2]
            t = ((u.scheme, u.hostname, port), f"{target} HTTP/1.1\r\nhost: {host}\r\n".encode())
            if len(self._targets) < 4096:
                self._targets[url] = t
        return t

    def _take(self, key: tuple) -> _Conn | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        now = asyncio.get_running_loop().time()
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to be stale
            if not conn.closed and now - conn.idle_since < self.keepalive_expiry:
                return conn
            conn.close()
        return None

    async def _connect(self, key: tuple, timeout: float) -> _Conn:
        scheme, host, port = key
        if scheme == "https" and self._ssl is None:
            self._ssl = ssl.create_default_context()
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(
                lambda: _Conn(key), host, port, ssl=self._ssl if scheme == "https" else None),
                timeout)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} took over {timeout:g} s") from None
        except OSError as e:
            raise httpx.ConnectError(f"cannot connect to {host}:{port}: {e}") from None
        return conn

    def _put_back(self, conn: _Conn) -> None:
        conn.idle_since = asyncio.get_running_loop().time()
        self._idle.setdefault(conn.key, []).append(conn)

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
