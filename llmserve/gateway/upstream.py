"""A lean HTTP/1.1 client for the request path: one write per request, body chunks
handed over as they arrive, keep-alive connections reused per upstream; also the
monitor's ``/load`` and ``/ready`` polls.

httpx/httpcore cost several CPU milliseconds per proxied request on a small machine
(anyio streams, a per-request scan of every pooled connection with a socket
readability check, request head and body written separately, one h11 event and a
timeout scope per body chunk); the gateway proxies every token of every stream,
so that cost is its ceiling. This client does only what the gateway needs: POST a
body (or GET), read the status and headers, then the body (Content-Length, chunked or
until close) with read-side backpressure. Errors are raised as ``httpx``
exceptions (``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``, ``RemoteProtocolError``,
``LocalProtocolError``), so callers keep one ``except httpx.HTTPError``.

No proxies from the environment, no redirects, no cookies, no content decoding
(the proxy asks for ``identity`` and relays bytes as they are).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx

_MAX_HEAD = 64 * 1024  # status line and headers together
_HIGH_WATER = 256 * 1024  # unread body bytes before the socket stops being read
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILER, _UNTIL_CLOSE, _DONE = range(8)


class _Conn(asyncio.Protocol):
    """One connection; parses one response at a time as bytes arrive."""

    def __init__(self, loop: asyncio.AbstractEventLoop, key: tuple) -> None:
        self.loop, self.key = loop, key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._buf = bytearray()  # unparsed bytes
        self._state = _DONE
        self._remaining = 0
        self._body = bytearray()  # parsed body bytes not yet taken
        self._paused = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        self.status = 0
        self.headers: dict[str, str] = {}
        self.reusable = False

    # ---- asyncio.Protocol -----------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._state == _DONE:  # bytes nobody asked for: the connection is unusable
            self.reusable = False
            self._fail(httpx.RemoteProtocolError("unexpected data from the upstream"))
            return
        self._buf += data
        try:
            self._parse()
        except httpx.RemoteProtocolError as e:
            self._fail(e)
            return
        self._wake()  # the waiting reader re-checks what it waits for
        if len(self._body) > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        if self._state == _UNTIL_CLOSE:
            self._state = _DONE  # a body delimited by the close is complete
        elif self._state != _DONE:
            msg = ("the upstream closed the connection before the response ended"
                   if self.status else "the upstream closed the connection without a response")
            self._exc = self._exc or httpx.RemoteProtocolError(
                msg if exc is None else f"{msg}: {exc}")
        self._wake()

    # ---- parsing ----------------------------------------------------------------------
    def _parse(self) -> None:
        buf = self._buf
        while buf:
            st = self._state
            if st == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > _MAX_HEAD:
                        raise httpx.RemoteProtocolError("the upstream's response head is too long")
                    return
                head = bytes(buf[:end])
                del buf[:end + 4]
                self._head(head)
            elif st == _LENGTH:
                n = min(self._remaining, len(buf))
                self._body += buf[:n]
                del buf[:n]
                self._remaining -= n
                if not self._remaining:
                    self._finish()
            elif st == _CHUNK_SIZE:
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > 1024:
                        raise httpx.RemoteProtocolError("bad chunk size line from the upstream")
                    return
                line = bytes(buf[:end]).split(b";", 1)[0].strip()
                del buf[:end + 2]
                try:
                    size = int(line, 16)
                except ValueError:
                    raise httpx.RemoteProtocolError(f"bad chunk size {line[:20]!r}") from None
                if size < 0:
                    raise httpx.RemoteProtocolError(f"bad chunk size {line[:20]!r}")
                self._remaining = size
                self._state = _CHUNK_DATA if size else _TRAILER
            elif st == _CHUNK_DATA:
                n = min(self._remaining, len(buf))
                self._body += buf[:n]
                del buf[:n]
                self._remaining -= n
                if not self._remaining:
                    self._state = _CHUNK_CRLF
            elif st == _CHUNK_CRLF:
                if len(buf) < 2:
                    return
                if buf[:2] != b"\r\n":
                    raise httpx.RemoteProtocolError("a chunk did not end with CRLF")
                del buf[:2]
                self._state = _CHUNK_SIZE
            elif st == _TRAILER:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                del buf[:end + 2]
                if end == 0:  # the blank line after the (usually absent) trailers
                    self._finish()
            elif st == _UNTIL_CLOSE:
                self._body += buf
                buf.clear()
            else:  # _DONE with bytes left: more than one response, or garbage
                self.reusable = False
                buf.clear()
                return

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise httpx.RemoteProtocolError(f"bad status line from the upstream: {lines[0][:80]!r}")
        status = int(parts[1])
        if 100 <= status < 200:
            return  # an interim response (100 Continue): the real one follows
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip():
                raise httpx.RemoteProtocolError(f"bad header line from the upstream: {line[:80]!r}")
            k, v = name.decode("latin-1").lower(), value.strip().decode("latin-1")
            headers[k] = f"{headers[k]}, {v}" if k in headers else v
        self.status, self.headers = status, headers
        conn = headers.get("connection", "").lower()
        self.reusable = parts[0] == b"HTTP/1.1" and "close" not in conn
        te = headers.get("transfer-encoding", "").lower()
        if te:
            if te.rsplit(",", 1)[-1].strip() != "chunked":
                raise httpx.RemoteProtocolError(f"unsupported transfer-encoding {te!r}")
            self._state = _CHUNK_SIZE
        elif status in (204, 304):
            self._finish()
        elif "content-length" in headers:
            cl = headers["content-length"].split(",")[0].strip()
            if not cl.isdigit():
                raise httpx.RemoteProtocolError(f"bad content-length {cl[:20]!r}")
            self._remaining = int(cl)
            self._state = _LENGTH
            if not self._remaining:
                self._finish()
        else:
            self.reusable = False
            self._state = _UNTIL_CLOSE
        self._wake()

    def _finish(self) -> None:
        self._state = _DONE
        if self._buf:
            self.reusable = False  # bytes past the response: do not trust the connection
            self._buf.clear()
        self._wake()

    # ---- the consumer's side --------------------------------------------------------
    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        self._exc = self._exc or exc
        self.reusable = False
        if self.transport is not None:
            self.transport.close()
        self._wake()

    async def _wait(self, timeout: float) -> None:
        if self._exc is not None:
            raise self._exc
        fut = self._waiter = self.loop.create_future()
        timer = self.loop.call_later(timeout, _time_out, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self._waiter = None
        if self._exc is not None:
            raise self._exc

    def start(self, data: bytes) -> None:
        self.status, self.headers, self._state, self._exc = 0, {}, _HEAD, None
        self._body.clear()
        assert self.transport is not None
        self.transport.write(data)

    async def read_head(self, timeout: float) -> None:
        while not self.status:
            await self._wait(timeout)

    async def read_body(self, timeout: float) -> bytes:
        """Whatever body bytes have arrived (waiting for some); b"" at the end."""
        while not self._body and self._state != _DONE:
            await self._wait(timeout)
        if self._exc is not None and not self._body:
            raise self._exc
        out = bytes(self._body)
        self._body.clear()
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return out

    @property
    def done(self) -> bool:
        return self._state == _DONE and self._exc is None

    def close(self) -> None:
        self.closed = True
        self.reusable = False
        if self.transport is not None:
            self.transport.close()


def _time_out(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(httpx.ReadTimeout("the upstream did not answer in time"))


class UpstreamResponse:
    """A response whose body is read on demand; ``aclose`` returns the connection."""

    def __init__(self, client: UpstreamClient, conn: _Conn, read_timeout: float) -> None:
        self._client, self._conn, self._timeout = client, conn, read_timeout
        self.status_code = conn.status
        self.headers = conn.headers
        self._closed = False

    def aiter_raw(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (a plain iterator: nothing to finalise if dropped)."""
        return self

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        data = await self._conn.read_body(self._timeout)
        if not data:
            raise StopAsyncIteration
        return data

    async def aread(self) -> bytes:
        parts = [chunk async for chunk in self]
        return b"".join(parts)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._client._put_back(self._conn)


class UpstreamClient:
    """Keep-alive connections per upstream origin.

    ``post`` sends and returns once the head is in (the body is streamed); ``get``
    reads a whole small answer (the monitor's polls). ``timeout`` overrides the
    connect and read timeouts for one call."""

    def __init__(self, *, connect_timeout: float, read_timeout: float,
                 keepalive_expiry: float = 30.0, max_idle_per_host: int = 512) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout  # for each wait on the upstream, as httpx's read timeout
        self.keepalive_expiry = keepalive_expiry
        self.max_idle_per_host = max_idle_per_host
        self._idle: dict[tuple, deque[_Conn]] = {}
        self._ssl: ssl.SSLContext | None = None
        self._targets: dict[str, tuple[tuple, bytes, bytes]] = {}  # URL → (key, path, host)

    async def post(self, url: str, content: bytes, headers: dict[str, str], *,
                   timeout: float | None = None) -> UpstreamResponse:
        return await self._send(b"POST", url, content, headers, timeout)

    async def get(self, url: str, *, timeout: float | None = None) -> tuple[int, bytes]:
        """Status and whole body of a GET."""
        resp = await self._send(b"GET", url, None, {}, timeout)
        try:
            return resp.status_code, await resp.aread()
        finally:
            await resp.aclose()

    async def _send(self, method: bytes, url: str, content: bytes | None,
                    headers: dict[str, str], timeout: float | None) -> UpstreamResponse:
        key, path, host = self._target(url)
        head = [method, b" ", path, b" HTTP/1.1\r\nhost: ", host, b"\r\n"]
        if content is not None:
            head += (b"content-length: ", str(len(content)).encode(), b"\r\n")
        for k, v in headers.items():
            if "\r" in v or "\n" in v or "\0" in v:
                raise httpx.LocalProtocolError(f"header {k!r} has a line break")
            head += (k.encode("latin-1"), b": ", v.encode("latin-1"), b"\r\n")
        head.append(b"\r\n")
        data = b"".join(head) + (content or b"")
        read_timeout = self.read_timeout if timeout is None else timeout
        # A kept-alive connection the upstream closed meanwhile fails before any byte of
        # a response; that is retried once on a new connection, as httpcore does.
        for reused in (True, False):
            conn = self._take(key) if reused else None
            if reused and conn is None:
                continue
            if conn is None:
                conn = await self._connect(key, self.connect_timeout if timeout is None else timeout)
            conn.start(data)
            try:
                await conn.read_head(read_timeout)
            except httpx.RemoteProtocolError:
                conn.close()
                if reused and not conn.status:
                    continue
                raise
            except BaseException:
                conn.close()
                raise
            return UpstreamResponse(self, conn, read_timeout)
        raise AssertionError("unreachable")

    def _target(self, url: str) -> tuple[tuple, bytes, bytes]:
        t = self._targets.get(url)
        if t is None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise httpx.UnsupportedProtocol(f"cannot send to {url!r}")
            https = parts.scheme == "https"
            port = parts.port or (443 if https else 80)
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            t = ((parts.hostname, port, https), path.encode(), parts.netloc.encode())
            if len(self._targets) < 4096:
                self._targets[url] = t
        return t

    def _take(self, key: tuple) -> _Conn | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()  # the most recently used is the likeliest alive
            if not conn.closed and now - conn.idle_since < self.keepalive_expiry:
                return conn
            conn.close()
        return None

    async def _connect(self, key: tuple, timeout: float) -> _Conn:
        host, port, https = key
        loop = asyncio.get_running_loop()
        ctx = None
        if https:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            ctx = self._ssl
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(lambda: _Conn(loop, key), host, port,
                                                       ssl=ctx)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
        except OSError as e:
            raise httpx.ConnectError(f"{e.strerror or e}") from None
        return conn

    def _put_back(self, conn: _Conn) -> None:
        if not (conn.done and conn.reusable and not conn.closed):
            conn.close()  # mid-body or not reusable: the rest of the response is unwanted
            return
        conn.idle_since = time.monotonic()
        idle = self._idle.setdefault(conn.key, deque())
        if len(idle) >= self.max_idle_per_host:
            idle.popleft().close()
        idle.append(conn)

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
