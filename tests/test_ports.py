"""llmserve.ports: a server's port comes from below the ephemeral range and is never
one something listens on, nor one handed out before."""

from __future__ import annotations

import socket

from llmserve import ports


def test_ports_are_below_the_ephemeral_range_distinct_and_bindable():
    low = ports._ephemeral_low()
    got = [ports.free_port() for _ in range(50)]
    assert len(set(got)) == len(got)
    if low - ports._FLOOR >= 1_000:
        assert all(ports._FLOOR <= p < low for p in got)
    for p in got[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_port_in_use_or_to_avoid_is_passed_over(monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", ports.free_port()))
        busy.listen()
        taken = busy.getsockname()[1]
        avoided, wanted = ports.free_port(), ports.free_port()
        picks = iter([taken, avoided, wanted])

        class Scripted:
            def randint(self, a, b):
                return next(picks)

        monkeypatch.setattr(ports, "_pick", Scripted())
        monkeypatch.setattr(ports, "_given", ports.deque(maxlen=8))
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: 60_000)
        assert ports.free_port(avoid={avoided}) == wanted


def test_listen_binds_at_once_and_only_replicas_share_a_port():
    port = ports.free_port()
    with ports.listen("127.0.0.1", port) as sock:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # accepted into the backlog before anything serves
        try:
            ports.listen("127.0.0.1", port).close()
            raise AssertionError("a second server bound a port in use")
        except OSError:
            pass
        assert sock.getsockname()[1] == port
    port = ports.free_port()
    with ports.listen("127.0.0.1", port, reuse_port=True), ports.listen("127.0.0.1", port, reuse_port=True):
        pass


def test_connections_to_a_listen_socket_send_without_nagle():
    """asyncio turns Nagle off only on accepted sockets whose proto is TCP: with it on, each
    SSE event of a kept-alive connection waited for the client's delayed ACK (~40 ms)."""
    import asyncio

    async def accepted_nodelay() -> int:
        got: list[int] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            got.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        sock = ports.listen("127.0.0.1", 0)
        server = await asyncio.start_server(handle, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection(*sock.getsockname())
            for _ in range(100):
                if got:
                    break
                await asyncio.sleep(0.01)
            writer.close()
        return got[0]

    assert asyncio.run(accepted_nodelay()) == 1


def test_the_instance_server_holds_its_port_before_it_imports_or_loads(monkeypatch):
    """``llmserve engine``'s entry binds the port and then hands the socket to the server
    (whose imports and model load take seconds): the port cannot be taken in between."""
    import llmserve.server.app as app
    from llmserve.server import entry

    port, seen = ports.free_port(), {}

    def fake_run_server(ecfg, scfg, sock=None):
        seen["sock"] = sock
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            seen["listening"] = True
        return 0

    monkeypatch.setattr(app, "run_server", fake_run_server)
    args = entry.parser().parse_args(["--port", str(port), "--host", "127.0.0.1"])
    assert entry.serve(args) == 0
    assert seen["listening"] and seen["sock"].getsockname()[1] == port
    seen["sock"].close()


def test_a_taken_port_stops_llmserve_engine_at_once_with_one_line():
    """Before any import or model load: exit code 2 and ``llmserve: error: ...``, no traceback."""
    import subprocess
    import sys

    port = ports.free_port()
    with ports.listen("127.0.0.1", port):
        run = subprocess.run([sys.executable, "-m", "llmserve.cli", "engine", "--host", "127.0.0.1", "--port",
                              str(port)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip() == f"llmserve: error: cannot listen on 127.0.0.1:{port}: address already in use"
