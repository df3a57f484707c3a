import random
from collections import Counter

import pytest
from pydantic import ValidationError

from llmserve.gateway.admission import ConcurrencyConfig
from llmserve.gateway.balancer import BalancerConfig, NoPick, Picker, PrefixConfig, RouteRequest

LOAD_ONLY = BalancerConfig(weights={"queue": 1.0, "running": 1.0})


def _picker(config=LOAD_ONLY, seed=0, **conc):
    return Picker(config, ConcurrencyConfig(**conc), rng=random.Random(seed))


def test_filters_out_unroutable_and_full_instances(make_instance):
    p = _picker()
    instances = [
        make_instance("not-ready", ready=False),
        make_instance("ejected", healthy=False),
        make_instance("draining", accepting=False),
        make_instance("breaker-open", breaker_available=False),
        make_instance("reports-draining", report={"draining": True}),
        make_instance("reports-unready", report={"ready": False}),
        make_instance("full", report={"num_running": 8, "max_num_seqs": 8}),
        make_instance("ok", report={"num_running": 7, "max_num_seqs": 8}),
    ]
    for _ in range(20):
        assert p.pick(RouteRequest(), instances).instance.instance_id == "ok"


def test_says_why_nothing_was_picked(make_instance):
    p = _picker()
    assert p.pick(RouteRequest(), []).why_not is NoPick.NO_INSTANCES
    assert p.pick(RouteRequest(), [make_instance("a", ready=False)]).why_not is \
        NoPick.NONE_ROUTABLE
    full = make_instance("a", report={"num_running": 8, "max_num_seqs": 8})
    result = p.pick(RouteRequest(), [full])
    assert result.instance is None and result.why_not is NoPick.NO_ROOM
    assert not p.has_room([full])
    assert p.pick(RouteRequest(), [make_instance("a")], exclude=["a"]).why_not is \
        NoPick.NO_INSTANCES


def test_clearly_least_loaded_instance_always_wins(make_instance):
    p = _picker()
    instances = [make_instance("busy", report={"num_running": 6, "num_waiting": 1}),
                 make_instance("idle", report={"num_running": 0}),
                 make_instance("mid", report={"num_running": 3})]
    picks = Counter(p.pick(RouteRequest(), instances).instance.instance_id for _ in range(200))
    assert picks == {"idle": 200}


def test_equal_instances_share_the_load(make_instance):
    p = _picker(seed=3)
    instances = [make_instance(name, report={"num_running": 1}) for name in "abcd"]
    n = 4000
    picks = Counter(p.pick(RouteRequest(), instances).instance.instance_id for _ in range(n))
    assert set(picks) == set("abcd")
    assert all(abs(c / n - 0.25) < 0.04 for c in picks.values()), picks


def test_weights_combine_scores(make_instance):
    # a: fewer running; b: less KV. KV weighted higher → b.
    instances = [make_instance("a", report={"num_running": 1, "kv_cache_usage": 0.9}),
                 make_instance("b", report={"num_running": 4, "kv_cache_usage": 0.1})]
    p = _picker(BalancerConfig(weights={"running": 1.0, "kv": 3.0}, tie_margin=0.0))
    scores = p.pick(RouteRequest(), instances).scores
    assert scores["a"] == pytest.approx((1.0 * 1 + 3.0 * 0.1) / 4)
    assert scores["b"] == pytest.approx((0.0 + 3.0 * 0.9) / 4)
    assert p.pick(RouteRequest(), instances).instance.instance_id == "b"


def test_prefix_affinity_repeats_go_to_the_same_instance_until_it_is_overloaded(make_instance):
    cfg = BalancerConfig(weights={"running": 1.0, "prefix": 2.0},
                         prefix=PrefixConfig(block_chars=8, imbalance_abs=3,
                                             imbalance_ratio=0.0))
    p = _picker(cfg, seed=1)
    req = RouteRequest("You are a helpful assistant. Answer briefly: what is 2+2?")
    inflight = {n: 0 for n in "abc"}

    def view():  # (reported with 8 seats each: room is not what this is about)
        return [make_instance(n, inflight=inflight[n], report={"num_running": 0}) for n in "abc"]

    first = p.pick(req, view()).instance.instance_id
    inflight[first] += 1
    for _ in range(3):  # up to 3 above the least loaded: affinity holds
        chosen = p.pick(req, view()).instance.instance_id
        assert chosen == first
        inflight[chosen] += 1
    chosen = p.pick(req, view()).instance.instance_id  # 4 over: guard lets load decide
    assert chosen != first
    assert p.scorer("prefix").hits == 3


def test_exclude_skips_tried_instances(make_instance):
    p = _picker()
    instances = [make_instance("a"), make_instance("b")]
    for _ in range(20):
        assert p.pick(RouteRequest(), instances, exclude={"a"}).instance.instance_id == "b"


def test_config_rejects_unknown_scorers_and_bad_weights():
    with pytest.raises(ValidationError, match="unknown scorers"):
        BalancerConfig(weights={"queue": 1, "magic": 1})
    with pytest.raises(ValidationError):
        BalancerConfig(weights={"queue": 0})
    with pytest.raises(ValidationError):
        BalancerConfig(weights={"queue": -1, "kv": 1})
