"""The adapter placement rule (gateway/balancer/adapter.py) and the picker applying it."""

import random
from collections import Counter

from llmserve.gateway.admission import ConcurrencyConfig
from llmserve.gateway.balancer import BalancerConfig, Picker, RouteRequest
from llmserve.gateway.balancer.adapter import place

LOAD_ONLY = BalancerConfig(weights={"queue": 1.0, "running": 1.0})


def _picker(seed=0):
    return Picker(LOAD_ONLY, ConcurrencyConfig(), rng=random.Random(seed))


def test_base_requests_see_every_candidate(make_instance):
    cands = [make_instance("a", adapters=frozenset({"x"})), make_instance("b")]
    p = place(None, cands)
    assert list(p.candidates) == cands and not p.loads


def test_resident_instances_win_even_when_busier(make_instance):
    busy_with_x = make_instance("a", adapters=frozenset({"x"}), report={"num_running": 6})
    idle = make_instance("b", report={"num_running": 0})
    p = place("x", [busy_with_x, idle])
    assert [c.instance_id for c in p.candidates] == ["a"] and not p.loads
    picks = Counter(_picker().pick(RouteRequest(adapter="x"), [busy_with_x, idle]).instance.instance_id
                    for _ in range(50))
    assert picks == {"a": 50}
    # the same two instances, a base request: the idle one, by load
    assert _picker().pick(RouteRequest(), [busy_with_x, idle]).instance.instance_id == "b"


def test_several_resident_instances_are_balanced_by_load(make_instance):
    cands = [make_instance("a", adapters=frozenset({"x"}), report={"num_running": 5}),
             make_instance("b", adapters=frozenset({"x", "y"}), report={"num_running": 1}),
             make_instance("c", report={"num_running": 0})]
    picks = Counter(_picker().choose(RouteRequest(adapter="x"), cands).instance_id for _ in range(50))
    assert picks == {"b": 50}


def test_nowhere_resident_loads_on_the_least_loaded(make_instance):
    cands = [make_instance("a", adapters=frozenset({"y"}), report={"num_running": 3}),
             make_instance("b", report={"num_running": 1}),
             make_instance("c", report={"num_running": 1, "num_waiting": 2})]
    p = place("x", cands)
    assert [c.instance_id for c in p.candidates] == ["b"] and p.loads
    tied = [make_instance("a", report={"num_running": 1}), make_instance("b", report={"num_running": 1})]
    assert len(place("x", tied).candidates) == 2
    picker = _picker(seed=1)
    picks = Counter(picker.pick(RouteRequest(adapter="x"), tied).instance.instance_id for _ in range(400))
    assert set(picks) == {"a", "b"}


def test_scores_are_those_of_the_placed_candidates(make_instance):
    cands = [make_instance("a", report={"num_running": 2}),
             make_instance("b", adapters=frozenset({"x"}), report={"num_running": 4}),
             make_instance("c", adapters=frozenset({"x"}), report={"num_running": 0})]
    result = _picker().pick(RouteRequest(adapter="x"), cands)
    assert result.instance.instance_id == "c" and set(result.scores) == {"b", "c"}


def test_resident_beats_loaded_in_memory_which_beats_a_load(make_instance):
    in_slot = make_instance("slot", adapters=frozenset({"x"}), report={"num_running": 5})
    in_memory = make_instance("mem", adapters_loaded=frozenset({"x"}), report={"num_running": 2})
    idle = make_instance("idle", report={"num_running": 0})
    assert [c.instance_id for c in place("x", [in_slot, in_memory, idle]).candidates] == ["slot"]
    p = place("x", [in_memory, idle])
    assert [c.instance_id for c in p.candidates] == ["mem"] and not p.loads
    assert place("x", [idle]).loads
