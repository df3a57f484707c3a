"""A large pool is sampled (power of d choices): bounded work per pick, still a good spread."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from pydantic import ValidationError

from llmserve.gateway.admission import AdmissionQueue, ConcurrencyConfig
from llmserve.gateway.balancer import BalancerConfig, Picker, PrefixConfig, RouteRequest
from llmserve.gateway.dispatch import Dispatcher, Stop
from llmserve.gateway.instance import InstanceView
from llmserve.priority import PriorityClass

LOAD = {"queue": 1.0, "running": 1.0}


def _picker(seed: int = 0, fixed: int = 1000, **cfg) -> Picker:
    return Picker(BalancerConfig(weights=cfg.pop("weights", LOAD), **cfg), ConcurrencyConfig(fixed=fixed),
                  rng=random.Random(seed))


def _pool(loads: list[int]) -> list[InstanceView]:
    return [InstanceView(f"i{k}", inflight=n) for k, n in enumerate(loads)]


def test_a_small_pool_is_scored_whole_and_the_idle_instance_always_wins():
    p = _picker()
    pool = _pool([5] * 31 + [0])  # 32: at score_all_up_to, every instance is scored
    assert Counter(p.pick(RouteRequest(), pool).instance.instance_id for _ in range(300)) == {"i31": 300}


def test_a_large_pool_scores_only_a_draw():
    # One idle instance among 100 busy ones: a draw of 4 finds it about 4 times in 100,
    # where scoring the whole pool would find it every time.
    sampled, whole = _picker(), _picker(score_all_up_to=1000)
    pool = _pool([5] * 100 + [0])
    n = 2000
    hits = sum(sampled.pick(RouteRequest(), pool).instance.instance_id == "i100" for _ in range(n))
    assert 0.02 * n < hits < 0.07 * n
    assert all(whole.pick(RouteRequest(), pool).instance.instance_id == "i100" for _ in range(50))


def test_a_draw_without_room_falls_back_to_the_whole_pool():
    p = _picker(fixed=5)
    pool = _pool([5] * 200 + [4])  # only the last has room: a draw of 4 almost never holds it
    assert all(p.pick(RouteRequest(), pool).instance.instance_id == "i200" for _ in range(100))
    assert p.pick(RouteRequest(), _pool([5] * 200)).instance is None


@pytest.mark.parametrize("d", [2, 4])
def test_sampled_picks_spread_load_far_better_than_random(d: int):
    # Balls into bins, the instances never finishing anything: with d choices the fullest bin
    # stays within a few of the mean (log log n / log d), a random pick lands ~3x the mean's spread.
    n_inst, n_req = 100, 2000
    p = _picker(seed=7, sample_size=d)
    load = [0] * n_inst
    for _ in range(n_req):
        pool = [InstanceView(f"i{k}", inflight=x) for k, x in enumerate(load)]
        load[int(p.pick(RouteRequest(), pool).instance.instance_id[1:])] += 1
    rng = random.Random(7)
    rand = Counter(rng.randrange(n_inst) for _ in range(n_req))
    mean = n_req / n_inst
    assert max(load) <= mean + 4
    assert max(rand.values()) >= mean + 8


def test_prefix_owner_joins_the_draw():
    p = _picker(seed=2, weights={"running": 1.0, "prefix": 2.0},
                prefix=PrefixConfig(block_chars=8, imbalance_abs=50, imbalance_ratio=0.0))
    req = RouteRequest("You are a helpful assistant. Answer briefly: what is 2+2?")
    load = [0] * 300
    first = None
    for _ in range(40):
        chosen = p.pick(req, _pool(load)).instance.instance_id
        first = first or chosen
        assert chosen == first  # the owner is scored every time, though 4 of 300 are drawn
        load[int(chosen[1:])] += 1
    assert p.scorer("prefix").hits == 39


def test_sample_size_is_validated():
    with pytest.raises(ValidationError):
        BalancerConfig(sample_size=1)
    with pytest.raises(ValidationError):
        BalancerConfig(score_all_up_to=0)


class _Item:
    exclude: frozenset[str] = frozenset()
    request = RouteRequest()

    def withdrawn(self) -> bool:
        return False


def test_dispatcher_finds_batch_room_outside_a_draw():
    # 200 instances with realtime room only, one with batch room: the batch request goes there.
    target = 8  # reserve 0.25: batch needs load < 6
    inflight = {f"i{k}": 6 for k in range(200)} | {"spare": 0}
    queue: AdmissionQueue[_Item] = AdmissionQueue()
    picker = Picker(concurrency=ConcurrencyConfig(fixed=target, realtime_reserve=0.25), rng=random.Random(0))
    sent: list[str] = []

    def commit(ticket, view: InstanceView, now: float) -> None:
        inflight[view.instance_id] += 1
        sent.append(view.instance_id)

    d = Dispatcher(queue, picker, lambda now: [InstanceView(i, inflight=n) for i, n in inflight.items()], commit)
    for _ in range(7):
        queue.offer(_Item(), PriorityClass.BATCH, 0.0)
    assert d.run(1.0) is Stop.NO_ROOM
    assert sent == ["spare"] * 6 and len(queue) == 1  # the seventh waits: only realtime room is left
