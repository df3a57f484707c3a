"""The connection guard both servers run (``llmserve.http_guard``), under real uvicorn on
loopback, in front of a bare ASGI app, spoken to over raw sockets: oversized heads and
URLs, clients that send too slowly or read nothing, the connection cap; and that
ordinary requests (in one read or in pieces, kept alive) pass untouched."""

from __future__ import annotations

import asyncio
import errno
import socket
import threading
import time

import pytest

from llmserve.http_guard import HttpLimits, uvicorn_options
from tests.gateway.fake_upstream import ServerThread

LIMITS = HttpLimits(max_header_bytes=4096, max_url_bytes=1024, header_timeout_s=0.6, body_timeout_s=0.6,
                    send_timeout_s=0.6, keep_alive_timeout_s=5.0, max_connections=6)
SLACK_S = 3.0  # on top of a timeout, for a loaded machine


class App:
    """/echo answers the body's length; /flood streams until the client is gone."""

    def __init__(self) -> None:
        self.disconnects = 0
        self.lock = threading.Lock()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                await send({"type": msg["type"] + ".complete"})
                if msg["type"] == "lifespan.shutdown":
                    return
        if scope["path"] == "/flood":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            gone = asyncio.ensure_future(_disconnect(receive))
            while not gone.done():  # uvicorn's send waits while the transport is paused
                await send({"type": "http.response.body", "body": b"x" * 65536, "more_body": True})
                await asyncio.sleep(0)
            return
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                with self.lock:
                    self.disconnects += 1
                return
            size += len(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        body = str(size).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


async def _disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


@pytest.fixture(scope="module")
def server():
    app = App()
    srv = ServerThread(app, **uvicorn_options(LIMITS)).start()
    srv.app = app
    yield srv
    srv.stop(force=True)


def connect(server) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_all(s: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything until the server closes the connection."""
    s.settimeout(timeout)
    out = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return out
        if not chunk:
            return out
        out += chunk


def status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def request(path: str = "/echo", headers: bytes = b"", body: bytes = b"") -> bytes:
    return (b"POST %s HTTP/1.1\r\nhost: t\r\n%scontent-length: %d\r\n\r\n"
            % (path.encode(), headers, len(body))) + body


def test_ordinary_requests_pass_in_one_read_in_pieces_and_kept_alive(server):
    with connect(server) as s:
        for _ in range(3):  # one connection, kept alive
            s.sendall(request(body=b"a" * 1000))
            assert s.recv(4096).split(b"\r\n\r\n")[1] == b"1000"
        data = request(headers=b"x-pad: " + b"p" * 3000 + b"\r\n", body=b"b" * 200_000)
        for i in range(0, len(data), 7000):  # in pieces, each well inside the timeouts
            s.sendall(data[i:i + 7000])
            time.sleep(0.01)
        resp = b""
        while not resp.endswith(b"200000"):
            resp += s.recv(4096)
        assert status(resp) == 200


def test_oversized_headers_get_431_whether_whole_or_dribbled(server):
    with connect(server) as s:
        s.sendall(request(headers=b"x-big: " + b"a" * 40_000 + b"\r\n"))
        resp = read_all(s)
    assert status(resp) == 431 and b"headers_too_large" in resp
    with connect(server) as s:  # one endless header value: cut by bytes, before it ends
        s.sendall(b"GET /echo HTTP/1.1\r\nhost: t\r\nx-endless: ")
        try:
            for _ in range(20):
                s.sendall(b"a" * 1000)
        except (BrokenPipeError, ConnectionResetError):
            pass
        resp = read_all(s)
    assert status(resp) == 431


def test_a_long_url_gets_414(server):
    with connect(server) as s:
        s.sendall(b"GET /echo?" + b"q" * 5000 + b" HTTP/1.1\r\nhost: t\r\n\r\n")
        resp = read_all(s)
    assert status(resp) == 414 and b"url_too_long" in resp


def test_slowloris_connections_are_closed_within_the_header_timeout(server):
    socks = [connect(server) for _ in range(4)]
    for s in socks:
        s.sendall(b"GET /echo HTTP/1.1\r\n")
    closed_at: list[float] = []
    t0 = time.monotonic()
    while len(closed_at) < len(socks) and time.monotonic() - t0 < LIMITS.header_timeout_s + SLACK_S:
        for s in socks:  # a byte each, every 0.1 s: each byte is on time, the head never is
            if s.fileno() == -1:
                continue
            try:
                s.sendall(b"x")
                s.setblocking(False)
                data = s.recv(4096)
                s.setblocking(True)
            except BlockingIOError:
                s.setblocking(True)
                continue
            except (BrokenPipeError, ConnectionResetError):
                data = b""
            assert not data or status(data) == 408
            closed_at.append(time.monotonic() - t0)
            s.close()
        time.sleep(0.1)
    assert len(closed_at) == len(socks)
    assert min(closed_at) >= LIMITS.header_timeout_s * 0.9


def test_an_idle_connection_is_closed_quietly(server):
    with connect(server) as s:
        t0 = time.monotonic()
        assert read_all(s, timeout=LIMITS.header_timeout_s + SLACK_S) == b""
        assert time.monotonic() - t0 < LIMITS.header_timeout_s + SLACK_S


def test_a_body_sent_too_slowly_is_cut_with_408(server):
    before = server.app.disconnects
    with connect(server) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nhost: t\r\ncontent-length: 1000\r\n\r\n")
        t0 = time.monotonic()
        resp = b""
        try:
            while time.monotonic() - t0 < LIMITS.body_timeout_s + SLACK_S:
                s.sendall(b"z" * 10)
                s.setblocking(False)
                try:
                    resp = s.recv(4096)
                    break
                except BlockingIOError:
                    pass
                finally:
                    s.setblocking(True)
                time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):
            pass
        resp += read_all(s)
    assert status(resp) == 408 and b"request_timeout" in resp
    deadline = time.monotonic() + SLACK_S
    while server.app.disconnects == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.app.disconnects == before + 1  # the app waiting on the body was told


def test_a_client_that_reads_nothing_is_dropped_after_the_send_timeout(server):
    s = connect(server)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(b"GET /flood HTTP/1.1\r\nhost: t\r\n\r\n")
    deadline = time.monotonic() + LIMITS.send_timeout_s + 2 * SLACK_S
    err = 0
    while time.monotonic() < deadline:  # never read: the reset shows as the socket's error
        err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            break
        time.sleep(0.05)
    s.close()
    assert err == errno.ECONNRESET


def test_requests_over_the_connection_cap_get_503_at_once(server):
    idle = [connect(server) for _ in range(LIMITS.max_connections)]
    try:
        with connect(server) as s:
            t0 = time.monotonic()
            s.sendall(request(body=b"{}"))
            resp = read_all(s, timeout=LIMITS.header_timeout_s)
            assert status(resp) == 503
            assert time.monotonic() - t0 < LIMITS.header_timeout_s  # not just closed by a timeout
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + SLACK_S
    while True:  # the idle ones gone, requests are served again
        with connect(server) as s:
            s.sendall(request(body=b"{}"))
            if status(s.recv(4096)) == 200:
                break
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_limits_are_validated():
    with pytest.raises(ValueError, match="header_timeout_s"):
        HttpLimits(max_header_bytes=1, max_url_bytes=1, header_timeout_s=0, body_timeout_s=1,
                   send_timeout_s=1, keep_alive_timeout_s=1, max_connections=1)
    opts = uvicorn_options(LIMITS)
    assert opts["limit_concurrency"] == 6 and opts["http"].limits is LIMITS
