"""The connection guard both servers run (``llmserve.http_guard``), under real uvicorn on
loopback, in front of a bare ASGI app, spoken to over raw sockets: oversized heads and
URLs, clients that send too slowly or read nothing, the connection cap; and that
ordinary requests (in one read or in pieces, kept alive) pass untouched."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from llmserve.http_guard import HttpLimits, uvicorn_options
from tests.bad_clients import (SLACK_S, connect, dribble_body, dribble_heads, exchange, post, read_all, status,
                               was_reset, wait_for)
from tests.gateway.fake_upstream import ServerThread

LIMITS = HttpLimits(max_header_bytes=4096, max_url_bytes=1024, header_timeout_s=0.6, body_timeout_s=0.6,
                    send_timeout_s=0.6, keep_alive_timeout_s=5.0, max_connections=6)


async def _disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class App:
    """/flood streams until the client is gone; anything else answers its body's length."""

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


@pytest.fixture(scope="module")
def server():
    app = App()
    srv = ServerThread(app, **uvicorn_options(LIMITS)).start()
    srv.app = app
    yield srv
    srv.stop(force=True)


def test_ordinary_requests_pass_in_one_read_in_pieces_and_kept_alive(server):
    with connect(server.port) as s:
        for _ in range(3):  # one connection, kept alive
            s.sendall(post("/echo", b"a" * 1000))
            assert s.recv(4096).split(b"\r\n\r\n")[1] == b"1000"
        data = post("/echo", b"b" * 200_000, headers=b"x-pad: " + b"p" * 3000 + b"\r\n")
        for i in range(0, len(data), 7000):  # in pieces, each well inside the timeouts
            s.sendall(data[i:i + 7000])
            time.sleep(0.01)
        resp = b""
        while not resp.endswith(b"200000"):
            resp += s.recv(4096)
        assert status(resp) == 200
        s.sendall(post("/echo", b"1") + post("/echo", b"22") + post("/echo", b"333"))  # pipelined
        resp = b""
        while resp.count(b"HTTP/1.1 200") < 3 or not resp.endswith(b"3"):
            resp += s.recv(4096)
        assert [r.split(b"\r\n\r\n")[1] for r in resp.split(b"HTTP/1.1 ")[1:]] == [b"1", b"2", b"3"]


def test_oversized_headers_get_431_whether_whole_or_dribbled(server):
    resp = exchange(server.port, post("/echo", b"{}", headers=b"x-big: " + b"a" * 40_000 + b"\r\n"))
    assert status(resp) == 431 and b"headers_too_large" in resp
    with connect(server.port) as s:  # one endless header value: cut by bytes, before it ends
        s.sendall(b"GET /echo HTTP/1.1\r\nhost: t\r\nx-endless: ")
        try:
            for _ in range(20):
                s.sendall(b"a" * 1000)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert status(read_all(s)) == 431


def test_a_long_url_gets_414(server):
    resp = exchange(server.port, b"GET /echo?" + b"q" * 5000 + b" HTTP/1.1\r\nhost: t\r\n\r\n")
    assert status(resp) == 414 and b"url_too_long" in resp


def test_slowloris_connections_are_closed_within_the_header_timeout(server):
    ended = dribble_heads(server.port, 4, give_up_s=LIMITS.header_timeout_s + SLACK_S)
    assert len(ended) == 4
    assert all(status(answer) == 408 for _, answer in ended)
    assert min(t for t, _ in ended) >= LIMITS.header_timeout_s * 0.9


def test_an_idle_connection_is_closed_quietly(server):
    with connect(server.port) as s:
        t0 = time.monotonic()
        assert read_all(s, timeout=LIMITS.header_timeout_s + SLACK_S) == b""
        assert time.monotonic() - t0 < LIMITS.header_timeout_s + SLACK_S


def test_a_body_sent_too_slowly_is_cut_with_408(server):
    before = server.app.disconnects
    resp = dribble_body(server.port, "/echo", give_up_s=LIMITS.body_timeout_s + SLACK_S)
    assert status(resp) == 408 and b"request_timeout" in resp
    wait_for(lambda: server.app.disconnects == before + 1, SLACK_S, "the app to see the disconnect")


def test_a_client_that_reads_nothing_is_dropped_after_the_send_timeout(server):
    with connect(server.port, rcvbuf=4096) as s:
        s.sendall(b"GET /flood HTTP/1.1\r\nhost: t\r\n\r\n")
        assert was_reset(s, within_s=LIMITS.send_timeout_s + 2 * SLACK_S)


def test_requests_over_the_connection_cap_get_503_at_once(server):
    idle = [connect(server.port) for _ in range(LIMITS.max_connections)]
    try:
        t0 = time.monotonic()
        reply = exchange(server.port, post("/echo", b"{}"))
        assert status(reply) == 503
        head, _, body = reply.partition(b"\r\n\r\n")
        assert b"retry-after: 1" in head.lower()
        assert json.loads(body)["error"]["code"] == "server_overloaded"  # OpenAI's shape, not plain text
        assert time.monotonic() - t0 < LIMITS.header_timeout_s  # answered, not closed by a timeout
    finally:
        for s in idle:
            s.close()
    # the idle ones gone, requests are served again
    wait_for(lambda: status(exchange(server.port, post("/echo", b"{}", headers=b"connection: close\r\n"))) == 200,
             SLACK_S, "a 200 below the cap")


def test_a_refused_client_still_uploading_reads_the_answer_not_a_reset(server):
    """Refused at the cap while its body is still on the way (as an SDK uploading a big
    request is): the 503 comes with a FIN and the rest of the upload is taken and dropped.
    A plain close with the body unread in the server's buffer resets the connection, and
    the client's upload fails with the answer unread."""
    idle = [connect(server.port) for _ in range(LIMITS.max_connections)]
    try:
        with connect(server.port) as s:
            s.sendall(post("/echo", b"x" * (8 << 20)))  # several socket buffers: refused mid-upload
            reply = read_all(s)
        assert status(reply) == 503 and b"server_overloaded" in reply
    finally:
        for c in idle:
            c.close()


def test_limits_are_validated():
    with pytest.raises(ValueError, match="header_timeout_s"):
        HttpLimits(max_header_bytes=1, max_url_bytes=1, header_timeout_s=0, body_timeout_s=1,
                   send_timeout_s=1, keep_alive_timeout_s=1, max_connections=1)
    opts = uvicorn_options(LIMITS)
    assert opts["limit_concurrency"] == 6 and opts["http"].limits is LIMITS


def test_both_servers_configs_are_the_one_limits_model_with_their_own_defaults():
    from llmserve.gateway.config import LimitsConfig
    from llmserve.server.config import ServerConfig

    instance, gateway = ServerConfig().http_limits(), LimitsConfig().http_limits()
    assert type(instance) is type(gateway) is HttpLimits
    assert instance == HttpLimits() and gateway.max_header_bytes == 2 * instance.max_header_bytes
    for make in (ServerConfig, LimitsConfig):  # validated once, by the shared model's types
        with pytest.raises(ValueError, match="send_timeout_s"):
            make(send_timeout_s=0)
        with pytest.raises(ValueError, match="max_connections"):
            make(max_connections=0)
