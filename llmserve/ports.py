"""Ports for the servers we start (instances, gateways, Redis).

A port taken with ``bind(port 0)`` comes from the kernel's ephemeral range, the
same range every outgoing connection draws its local port from: between our
pick and the child's own bind, any client on the machine can take it, and the
child dies with "address already in use". Picking below that range leaves only
other servers to collide with, and the bind check catches those listening.
"""

from __future__ import annotations

import random
import socket
from collections import deque
from pathlib import Path

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_FLOOR = 10_000          # below: well-known and registered services people run
# Handed out lately by this process, not yet bound by their servers: never twice. Bounded,
# so a controller that starts instances for months does not run out of ports.
_given: deque[int] = deque(maxlen=1_024)
_pick = random.SystemRandom()  # a test's random.seed must not make processes pick alike


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only."""
    return host.startswith("127.") or host in ("localhost", "::1")


def _ephemeral_low() -> int:
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _binds(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", avoid: set[int] | None = None) -> int:
    """A port nothing listens on now, outside the ephemeral range where it can be."""
    taken = set(_given) | (avoid or set())
    high = _ephemeral_low() - 1
    if high - _FLOOR >= 1_000:
        for _ in range(256):
            port = _pick.randint(_FLOOR, high)
            if port not in taken and _binds(host, port):
                _given.append(port)
                return port
    for _ in range(64):  # no room below the ephemeral range: the kernel's pick
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in taken:
            _given.append(port)
            return port
    raise RuntimeError(f"no free port found on {host}")


def listen(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A listening TCP socket for a server of ours, bound now (before its slow start-up, so the
    port is its own from the first moment); ``reuse_port``: replicas bind it too and the kernel
    balances connections between them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose proto
    # says TCP, and without it Nagle holds an SSE event until the client's delayed ACK (~40 ms
    # a request on a kept-alive connection, such as the gateway's to its instances).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock
