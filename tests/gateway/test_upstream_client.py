"""The gateway's upstream HTTP/1.1 client against a scripted raw server: framing,
keep-alive reuse, and every way a response can go wrong."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from llmserve.gateway.upstream import UpstreamClient


class RawServer:
    """Reads one request head + body per turn and answers with ``script(n)`` bytes;
    a script entry may be a list (written piece by piece) or a callable(writer)."""

    def __init__(self, answers) -> None:
        self.answers = answers
        self.connections = 0
        self.requests: list[bytes] = []
        self.eofs = 0

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    self.eofs += 1
                    return
                length = int(next((line.split(b":")[1] for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length")), b"0"))
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                answer = self.answers(len(self.requests) - 1)
                if callable(answer):
                    if await answer(writer) == "close":
                        return
                    continue
                for piece in answer if isinstance(answer, list) else [answer]:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0)
        finally:
            writer.close()


def client(**kw) -> UpstreamClient:
    return UpstreamClient(connect_timeout=kw.pop("connect_timeout", 5.0),
                          read_timeout=kw.pop("read_timeout", 5.0), **kw)


OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 7\r\n\r\n{\"a\":1}"


async def test_content_length_and_keep_alive_reuse():
    async with RawServer(lambda n: OK) as srv:
        c = client()
        for _ in range(3):
            r = await c.post(srv.url + "/v1/completions", b'{"x": 1}', {"x-request-id": "r1"})
            assert r.status_code == 200 and r.headers["content-type"] == "application/json"
            assert await r.aread() == b'{"a":1}'
            await r.aclose()
        assert srv.connections == 1
        req = srv.requests[0].lower()  # header names are case-insensitive
        assert req.startswith(b"post /v1/completions http/1.1\r\n")
        assert b"\r\nhost: 127.0.0.1:" in req and b"\r\ncontent-length: 8\r\n" in req
        assert b"\r\nx-request-id: r1\r\n" in req and req.endswith(b'\r\n\r\n{"x": 1}')
        await c.aclose()


async def test_chunked_split_byte_by_byte_with_extensions_trailers_and_interim_response():
    raw = (b"HTTP/1.1 100 Continue\r\n\r\n"
           b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n"
           b"X-Dup: a\r\nX-Dup: b\r\n\r\n"
           b"5;ext=1\r\nhello\r\n1\r\n \r\nA\r\ndata: [12]\r\n0\r\ntrailer: x\r\n\r\n")
    async with RawServer(lambda n: [raw[i:i + 1] for i in range(len(raw))]) as srv:
        c = client()
        r = await c.post(srv.url + "/s", b"{}", {})
        assert r.status_code == 200 and r.headers["x-dup"] == "a, b"
        assert r.headers["content-type"] == "text/event-stream"
        assert b"".join([chunk async for chunk in r.aiter_raw()]) == b"hello data: [12]"
        await r.aclose()
        r = await c.post(srv.url + "/s", b"{}", {})  # the connection was reusable
        assert await r.aread() == b"hello data: [12]"
        await r.aclose()
        assert srv.connections == 1
        await c.aclose()


async def test_body_until_close_is_complete_and_the_connection_not_reused():
    async def answer(writer):
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\npart one, ")
        await writer.drain()
        writer.write(b"part two")
        return "close"

    async with RawServer(lambda n: answer) as srv:
        c = client()
        for _ in range(2):
            r = await c.post(srv.url + "/", b"", {})
            assert await r.aread() == b"part one, part two"
            await r.aclose()
        assert srv.connections == 2
        await c.aclose()


async def test_stream_cut_mid_body_raises_after_the_data_that_came():
    async def answer(writer):
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\nfirst\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        return "close"

    async with RawServer(lambda n: answer) as srv:
        c = client()
        r = await c.post(srv.url + "/", b"", {})
        chunks = r.aiter_raw()
        assert await anext(chunks) == b"first\n"
        with pytest.raises(httpx.RemoteProtocolError):
            await anext(chunks)
        await r.aclose()
        await c.aclose()


async def test_no_response_at_all_is_a_protocol_error_and_refused_is_a_connect_error():
    async def hang_up(writer):
        return "close"

    async with RawServer(lambda n: hang_up) as srv:
        c = client()
        with pytest.raises(httpx.RemoteProtocolError):
            await c.post(srv.url + "/", b"", {})
        assert len(srv.requests) == 1  # never resent: the upstream may have acted on it
        url = srv.url
    srv.server.close()
    await srv.server.wait_closed()
    with pytest.raises(httpx.ConnectError):
        await c.post(url + "/", b"", {})
    await c.aclose()


async def test_read_timeout():
    async def silent(writer):
        await asyncio.sleep(5)
        return "close"

    async with RawServer(lambda n: silent) as srv:
        c = client(read_timeout=0.1)
        with pytest.raises(httpx.ReadTimeout):
            await c.post(srv.url + "/", b"", {})
        await c.aclose()


async def test_a_kept_alive_connection_the_server_closed_is_replaced():
    async def once(writer):
        writer.write(OK)
        await writer.drain()
        return "close"  # then the server drops the idle connection

    async with RawServer(lambda n: once) as srv:
        c = client()
        for i in range(4):
            r = await c.post(srv.url + "/", b"", {})
            assert await r.aread() == b'{"a":1}'
            await r.aclose()
            await asyncio.sleep(0.05)  # the close arrives before the next request
        assert srv.connections >= 4
        await c.aclose()


async def test_closing_mid_body_drops_the_connection():
    async def endless(writer):
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(100):
            writer.write(b"2\r\nab\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)
        return "close"

    async with RawServer(lambda n: endless if n == 0 else OK) as srv:
        c = client()
        r = await c.post(srv.url + "/", b"", {})
        assert await anext(r.aiter_raw())
        await r.aclose()
        r = await c.post(srv.url + "/", b"", {})
        assert await r.aread() == b'{"a":1}'
        await r.aclose()
        assert srv.connections == 2
        await c.aclose()


async def test_large_body_with_backpressure_and_header_injection_refused():
    big = bytes(range(256)) * 8192  # 2 MiB, past the high-water mark
    head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(big)
    async with RawServer(lambda n: [head, big]) as srv:
        c = client()
        r = await c.post(srv.url + "/", b"", {})
        got = bytearray()
        async for chunk in r.aiter_raw():
            got += chunk
            await asyncio.sleep(0)
        assert bytes(got) == big
        await r.aclose()
        with pytest.raises(httpx.LocalProtocolError):
            await c.post(srv.url + "/", b"", {"x-request-id": "a\r\nx-evil: 1"})
        with pytest.raises(httpx.LocalProtocolError):
            await c.post(srv.url + "/", b"", {"x-request-id": "caf\u00e9 \u2615"})
        await c.aclose()


async def test_malformed_responses_are_protocol_errors():
    answers = [b"garbage\r\n\r\n",
               b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
               b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n"]
    for answer in answers:
        async with RawServer(lambda n, a=answer: a) as srv:
            c = client()
            with pytest.raises(httpx.RemoteProtocolError):
                r = await c.post(srv.url + "/", b"", {})
                await r.aread()
            await c.aclose()


async def test_get_reads_the_whole_answer_on_the_same_connections():
    answers = [b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\nno", OK]
    async with RawServer(lambda n: answers[n % 2]) as srv:
        c = client()
        assert await c.get(srv.url + "/load", timeout=1.0) == (404, b"no")
        assert await c.get(srv.url + "/ready", timeout=1.0) == (200, b'{"a":1}')
        r = await c.post(srv.url + "/v1/completions", b"{}", {})
        assert r.status_code == 404
        await r.aclose()
        assert srv.connections == 1
        assert srv.requests[0].startswith(b"GET /load HTTP/1.1\r\n")
        assert b"content-length" not in srv.requests[0].lower()
        await c.aclose()


async def test_read_timeout_mid_body_and_unsupported_scheme():
    async def stall(writer):
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await asyncio.sleep(5)
        return "close"

    async with RawServer(lambda n: stall) as srv:
        c = client(read_timeout=0.2)
        r = await c.post(srv.url + "/", b"", {})
        chunks = r.aiter_raw()
        assert await anext(chunks) == b"abc"
        with pytest.raises(httpx.ReadTimeout):
            await anext(chunks)
        await r.aclose()
        with pytest.raises(httpx.UnsupportedProtocol):
            await c.post("ftp://127.0.0.1/", b"", {})
        await c.aclose()
