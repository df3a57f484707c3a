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
