"""Misbehaving HTTP clients over raw sockets, for the guard, instance and gateway tests:
ones that dribble their head or body, never read, hold connections, or leave."""

from __future__ import annotations

import errno
import json
import socket
import time
from collections.abc import Callable

SLACK_S = 3.0  # on top of a server's timeout, for a loaded machine


def connect(port: int, *, rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket()
    if rcvbuf is not None:  # before connect, so the advertised window is small from the start
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
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


def post(path: str, body: dict | bytes, headers: bytes = b"") -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return (b"POST %s HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n%scontent-length: %d\r\n\r\n"
            % (path.encode(), headers, len(data))) + data


def exchange(port: int, request: bytes) -> bytes:
    """Send one request on a fresh connection; the response (read until the server closes)."""
    with connect(port) as s:
        s.sendall(request)
        return read_all(s)


def _poll(s: socket.socket) -> bytes | None:
    """Bytes the server sent, b"" if it closed, None if nothing yet."""
    s.setblocking(False)
    try:
        return s.recv(65536)
    except BlockingIOError:
        return None
    except ConnectionResetError:
        return b""
    finally:
        s.setblocking(True)


def dribble_heads(port: int, n: int, give_up_s: float) -> list[tuple[float, bytes]]:
    """``n`` connections that send a request head a byte every 0.1 s (each byte on time,
    the head never whole); (seconds until the server answered or closed, its answer)
    per connection, for those the server ended within ``give_up_s``."""
    socks = [connect(port) for _ in range(n)]
    for s in socks:
        s.sendall(b"GET /health HTTP/1.1\r\nhost: t\r\n")
    ended: list[tuple[float, bytes]] = []
    t0 = time.monotonic()
    try:
        while socks and time.monotonic() - t0 < give_up_s:
            for s in list(socks):
                try:
                    s.sendall(b"x")
                except (BrokenPipeError, ConnectionResetError):
                    pass
                got = _poll(s)
                if got is not None:
                    ended.append((time.monotonic() - t0, got + read_all(s, timeout=1.0)))
                    socks.remove(s)
                    s.close()
            time.sleep(0.1)
    finally:
        for s in socks:
            s.close()
    return ended


def dribble_body(port: int, path: str, give_up_s: float) -> bytes:
    """A POST whose head is whole but whose body comes 10 bytes every 0.1 s; the answer."""
    with connect(port) as s:
        s.sendall(b"POST %s HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n"
                  % path.encode())
        t0 = time.monotonic()
        while time.monotonic() - t0 < give_up_s:
            try:
                s.sendall(b"          ")
            except (BrokenPipeError, ConnectionResetError):
                return read_all(s, timeout=1.0)  # what the server said before it stopped reading
            got = _poll(s)
            if got is not None:
                return got + read_all(s, timeout=1.0)
            time.sleep(0.1)
        return b""


def was_reset(s: socket.socket, within_s: float) -> bool:
    """Whether the server reset ``s`` within ``within_s``, seen without reading from it."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNRESET:
            return True
        time.sleep(0.05)
    return False


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
