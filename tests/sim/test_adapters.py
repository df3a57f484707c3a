"""LoRA adapters in the simulator: the live placement rule, and a load that delays the
first request routed to an instance without the adapter."""

import numpy as np
import pytest
from pydantic import ValidationError

from llmserve.gateway.balancer import Picker
from llmserve.sim.adapters import Resident, SimAdapters
from llmserve.sim.results import COMPLETED
from llmserve.sim.simulator import SimConfig, Simulator
from llmserve.sim.traces import Trace
from tests.sim.test_simulator import UNLIMITED, small_profile, static


def _spaced(n=60, gap_s=2.0):
    """Requests far apart: each finds the pool idle, so only a load can delay one."""
    arrivals = np.arange(n) * gap_s
    return Trace("spaced", arrivals, np.full(n, 20), np.full(n, 4), np.zeros(n, np.int8), float(arrivals[-1]) + 1)


def _run(adapters, instances=3, trace=None):
    sim = Simulator(trace or _spaced(), small_profile(), static(instances), SimConfig(initial_instances=instances),
                    admission=UNLIMITED, adapters=adapters)
    return sim, sim.run()


def test_the_first_request_on_an_adapter_waits_for_its_load_and_the_next_do_not():
    mix = SimAdapters(shares={"sql": 0.5}, load_s=1.5)
    sim, res = _run(mix)
    _, base = _run(None)
    assert (sim.status == COMPLETED).all()
    on = np.array([a == "sql" for a in sim.adapter_of])
    first = int(np.argmax(on))
    assert sim.ttft[first] == pytest.approx(base.ttft[first] + 1.5, abs=1e-6)
    later = np.flatnonzero(on)[1:]
    assert np.allclose(sim.ttft[later], base.ttft[later])  # resident where it was loaded: no wait
    assert np.allclose(sim.ttft[~on], base.ttft[~on])  # base requests never wait for a load
    # the live rule: an idle pool keeps the adapter on the one instance it was loaded on
    assert sum("sql" in i.adapters.names() for i in sim.instances.values()) == 1


def test_the_simulator_places_adapter_requests_with_the_live_picker(monkeypatch):
    seen = []
    choose = Picker.choose

    def spy(self, request, candidates):
        chosen = choose(self, request, candidates)
        seen.append((request.adapter, chosen.instance_id, request.adapter in chosen.adapters))
        return chosen

    monkeypatch.setattr(Picker, "choose", spy)
    _run(SimAdapters(shares={"a": 0.3, "b": 0.3}, load_s=0.5))
    for name in ("a", "b"):
        picks = [(iid, had) for adapter, iid, had in seen if adapter == name]
        assert not picks[0][1] and all(had for _, had in picks[1:])  # loaded once, then resident
        assert len({iid for iid, _ in picks}) == 1


def test_an_adapter_pushed_out_of_a_full_instance_is_loaded_again():
    mix = SimAdapters(shares={"a": 0.5, "b": 0.5}, load_s=1.0, max_resident=1)
    sim, _ = _run(mix, instances=1)
    _, base = _run(None, instances=1)
    adapters = sim.adapter_of
    switches = [i for i in range(1, len(adapters)) if adapters[i] != adapters[i - 1]]
    waited = np.flatnonzero(sim.ttft - base.ttft > 0.5)
    assert list(waited) == [0, *switches]  # every change of adapter reloads on the one instance


def test_resident_keeps_the_most_recently_used():
    r = Resident(2)
    assert r.serve_at("a", 0.0, 1.0) == 1.0 and r.serve_at("b", 0.5, 1.0) == 1.5
    assert r.serve_at("a", 2.0, 1.0) == 1.0  # loaded already
    r.serve_at("c", 3.0, 1.0)  # b is the least recently used: out
    assert r.names() == {"a", "c"}


def test_shares_are_checked_and_drawn_with_the_seed():
    with pytest.raises(ValidationError, match="sum to at most 1"):
        SimAdapters(shares={"a": 0.7, "b": 0.5})
    mix = SimAdapters(shares={"a": 0.25, "b": 0.25})
    drawn = mix.assign(20_000, seed=3)
    assert drawn == mix.assign(20_000, seed=3) and drawn != mix.assign(20_000, seed=4)
    assert abs(drawn.count(None) / 20_000 - 0.5) < 0.02
