"""The compiled column score gives the very bits of the Python path, so the same picks."""

import random
from types import SimpleNamespace

import pytest

from llmserve.gateway.balancer import BalancerConfig, Picker, RouteRequest, columns
from llmserve.gateway.balancer import picker as picker_module
from llmserve.gateway.balancer.busy import BusyScorer
from llmserve.gateway.balancer.combine import weighted_mean
from llmserve.gateway.balancer.kv import KVScorer
from llmserve.gateway.balancer.queue import QueueScorer
from llmserve.gateway.balancer.running import RunningScorer
from llmserve.gateway.instance import InstanceView
from tests.gateway.conftest import load_report

_FLOATS = [0.0, -0.0, 1.0, 0.5, 1e-300, 2.0, -1.0, float("nan"), float("inf"), -float("inf")]
_SCORERS = [QueueScorer(), RunningScorer(), KVScorer(), BusyScorer()]
_REQ = RouteRequest()


def _bits(values):
    return [v.hex() for v in values]


def _view(rng: random.Random) -> SimpleNamespace:
    def count():
        return rng.choice([0, 1, 3, rng.randint(0, 500), -rng.randint(1, 9), 2**52 - 1, -(2**52 - 1)])

    def fraction():
        return rng.choice([None, rng.random(), rng.choice(_FLOATS)])

    return SimpleNamespace(est_waiting=count(), est_running=count(), kv_usage=fraction(),
                           busy_fraction=fraction())


def _python(cands, spec, weights):
    cols = [e if isinstance(e, list) else s.score(_REQ, cands) for e, s in zip(spec, _SCORERS + [None])]
    return weighted_mean(cols, list(weights), sum(weights))


def test_the_extension_is_built_with_the_package():
    # setup.py builds it; without it the simulator runs the (equal, slower) Python path
    assert columns.COMPILED


@pytest.mark.skipif(not columns.COMPILED, reason="the extension is not built")
def test_same_bits_as_the_python_path_on_random_pools():
    rng = random.Random(11)
    declared = tuple((s.attribute, int(s.rule)) for s in _SCORERS)
    for _ in range(4_000):
        cands = [_view(rng) for _ in range(rng.randint(0, 40))]
        extra = [rng.choice(_FLOATS + [rng.random()]) for _ in cands]  # a stateful scorer's column
        spec = declared + (extra,)
        weights = tuple(rng.choice([1.0, 0.5, 2.0, float("inf"), rng.random() + 1e-3]) for _ in spec)
        got = columns._compiled.score(cands, spec, weights, sum(weights))
        assert got is not None
        assert _bits(got) == _bits(_python(cands, spec, weights)), (cands, weights)


@pytest.mark.skipif(not columns.COMPILED, reason="the extension is not built")
@pytest.mark.parametrize("field,value", [("est_waiting", 2**52), ("est_running", -(2**60)), ("est_waiting", 1.5),
                                         ("kv_usage", 1), ("busy_fraction", "0.5")])
def test_a_value_it_does_not_take_falls_back_to_python(field, value):
    cands = [SimpleNamespace(est_waiting=0, est_running=2, kv_usage=0.25, busy_fraction=None) for _ in range(3)]
    setattr(cands[1], field, value)
    spec = tuple((s.attribute, int(s.rule)) for s in _SCORERS)
    assert columns._compiled.score(cands, spec, (1.0,) * 4, 4.0) is None
    if not isinstance(value, str):  # the picker's Python path decides (a string fails there as anywhere)
        picker = Picker(BalancerConfig(weights={"queue": 1.0, "running": 1.0, "kv": 1.0, "busy": 1.0}))
        assert _bits(picker.score(_REQ, cands)) == _bits(_python(cands, spec, (1.0,) * 4))


def _pool(rng: random.Random, n: int) -> list[InstanceView]:
    out = []
    for i in range(n):
        report = load_report(instance_id=str(i), num_running=rng.randint(0, 30), max_num_seqs=64,
                             num_waiting=rng.choice([0, 0, rng.randint(0, 5)]),
                             kv_cache_usage=rng.random(), busy_fraction=rng.random())
        out.append(InstanceView(str(i), inflight=rng.randint(0, 40), inflight_at_report=rng.randint(0, 40),
                                report=report))
    return out


def test_a_picker_picks_the_same_with_and_without_the_extension(monkeypatch):
    def picks(seed: int) -> list[str]:
        rng, picker = random.Random(seed), Picker(BalancerConfig(), rng=random.Random(seed))
        out = []
        for k in range(300):
            text = "" if k % 3 else f"system prompt {k % 7} " * 10  # the prefix scorer's column too
            result = picker.pick(RouteRequest(prefix_text=text), _pool(rng, rng.randint(1, 30)))
            out.append(result.instance.instance_id if result.instance else "-")
            out.append(" ".join(f"{s.hex()}" for s in result.scores.values()))
        return out

    compiled = picks(3)
    monkeypatch.setattr(picker_module, "compiled_score", columns._declined)
    assert picks(3) == compiled
