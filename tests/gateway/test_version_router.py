import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmserve.gateway.version_router import (RouteReason, UnknownVersion, VersionRouter,
                                             rendezvous_pick, with_weight)

USERS = [f"user-{i}" for i in range(20_000)]


def _bound(p: float, n: int, sds: float = 5.0) -> float:
    return sds * math.sqrt(p * (1 - p) / n) + 1e-9


def _assign(weights: dict[str, float], users=USERS, salt: str = "m") -> dict[str, str]:
    return {u: rendezvous_pick(u, weights, salt) for u in users}


def test_sticky_shares_match_weights():
    weights = {"v1": 0.6, "v2": 0.3, "canary": 0.1}
    counts = Counter(_assign(weights).values())
    for v, p in weights.items():
        assert abs(counts[v] / len(USERS) - p) < _bound(p, len(USERS)), (v, counts)


def test_same_user_same_version_across_calls_and_router_instances():
    a = VersionRouter({"v1": 50, "v2": 50}, salt="chat")
    b = VersionRouter({"v1": 50, "v2": 50}, salt="chat")
    for u in USERS[:500]:
        first = a.route(user=u)
        assert first.reason is RouteReason.STICKY
        assert all(a.route(user=u) == first for _ in range(3))
        assert b.route(user=u) == first


def test_different_salts_split_users_independently():
    v_a = _assign({"v1": 0.5, "v2": 0.5}, USERS[:4000], salt="a")
    v_b = _assign({"v1": 0.5, "v2": 0.5}, USERS[:4000], salt="b")
    agree = sum(v_a[u] == v_b[u] for u in v_a) / 4000
    assert abs(agree - 0.5) < _bound(0.5, 4000)


def test_raising_canary_by_five_percent_moves_five_percent_all_to_canary():
    before = _assign({"stable": 95, "canary": 5})
    after = _assign({"stable": 90, "canary": 10})
    moved = [u for u in USERS if before[u] != after[u]]
    assert abs(len(moved) / len(USERS) - 0.05) < _bound(0.05, len(USERS))
    assert all(before[u] == "stable" and after[u] == "canary" for u in moved)


def test_canary_step_with_three_versions_moves_only_the_step():
    base = {"v1": 70, "v2": 30, "canary": 0}
    before = _assign(with_weight(base, "canary", 0.05))
    after = _assign(with_weight(base, "canary", 0.10))
    moved = [u for u in USERS if before[u] != after[u]]
    assert abs(len(moved) / len(USERS) - 0.05) < _bound(0.05, len(USERS))
    assert all(after[u] == "canary" for u in moved)
    # v1 and v2 gave up users in their 70:30 proportion
    donors = Counter(before[u] for u in moved)
    assert abs(donors["v1"] / len(moved) - 0.7) < _bound(0.7, len(moved))


def test_rollback_returns_exactly_the_canary_users():
    with_canary = _assign({"stable": 80, "canary": 20})
    rolled_back = _assign({"stable": 80, "canary": 0})
    moved = {u for u in USERS if with_canary[u] != rolled_back[u]}
    assert moved == {u for u in USERS if with_canary[u] == "canary"}


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(0.05, 10.0), min_size=2, max_size=5), st.data())
def test_changing_one_weight_moves_only_its_share_change(raw, data):
    base = {f"v{i}": w for i, w in enumerate(raw)}
    total = sum(raw)
    target = data.draw(st.sampled_from(sorted(base)))
    old_share = base[target] / total
    new_share = data.draw(st.floats(0.0, 0.95))
    users = USERS[:3000]
    before = _assign(base, users)
    after = _assign(with_weight(base, target, new_share), users)
    moved = [u for u in users if before[u] != after[u]]
    delta = abs(new_share - old_share)
    assert abs(len(moved) / len(users) - delta) < _bound(max(delta, 0.01), len(users)) + 0.005
    # every move is to or from the changed version
    assert all(target in (before[u], after[u]) for u in moved)


def test_header_forces_a_version_even_at_weight_zero():
    r = VersionRouter({"v1": 1, "canary": 0})
    d = r.route(user="alice", forced="canary")
    assert (d.version, d.reason) == ("canary", RouteReason.HEADER)
    with pytest.raises(UnknownVersion):
        r.route(forced="v9")


def test_anonymous_requests_split_randomly_by_weight_with_seeded_rng():
    r = VersionRouter({"v1": 0.7, "v2": 0.3, "off": 0.0}, rng=random.Random(7))
    n = 20_000
    decisions = [r.route() for _ in range(n)]
    assert all(d.reason is RouteReason.RANDOM for d in decisions)
    counts = Counter(d.version for d in decisions)
    assert counts["off"] == 0
    assert abs(counts["v1"] / n - 0.7) < _bound(0.7, n)
    again = VersionRouter({"v1": 0.7, "v2": 0.3, "off": 0.0}, rng=random.Random(7))
    assert [again.route().version for _ in range(100)] == [d.version for d in decisions[:100]]


def test_set_weights_validates_and_normalises():
    r = VersionRouter({"a": 3, "b": 1})
    assert r.weights == {"a": 0.75, "b": 0.25}
    r.set_weights({"a": 2})  # b omitted → 0
    assert r.weights == {"a": 1.0, "b": 0.0}
    assert all(r.route(user=f"u{i}").version == "a" for i in range(200))
    with pytest.raises(ValueError):
        r.set_weights({"a": 0, "b": 0})
    with pytest.raises(ValueError):
        r.set_weights({"a": -1, "b": 2})
    with pytest.raises(UnknownVersion):
        r.set_weights({"c": 1})


def test_with_weight_keeps_other_proportions():
    w = with_weight({"v1": 60, "v2": 20, "c": 0}, "c", 0.2)
    assert w == pytest.approx({"v1": 0.6, "v2": 0.2, "c": 0.2})
    assert with_weight({"v1": 1, "c": 0}, "c", 1.0) == {"v1": 0.0, "c": 1.0}


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_pinned_users_stay_put_while_the_canary_weight_grows():
    clock = FakeClock()
    r = VersionRouter({"v1": 0.95, "v2": 0.05}, salt="m", stickiness_window_s=60, clock=clock)
    users = [f"u{i}" for i in range(2000)]
    first = {u: r.route(u).version for u in users}
    r.set_weights({"v1": 0.5, "v2": 0.5})
    clock.t = 30.0
    again = {u: r.route(u) for u in users}
    assert {u: d.version for u, d in again.items()} == first  # mid-conversation: nobody moved
    assert all(d.reason is RouteReason.PINNED for d in again.values())
    new = Counter(r.route(f"new{i}").version for i in range(2000))
    assert 850 < new["v2"] < 1150  # new users get today's weights
    clock.t = 30.0 + 61.0  # idle past the window: hashed again, with the new weights
    moved = sum(r.route(u).version != first[u] for u in users)
    assert moved > 500


def test_a_version_at_weight_zero_keeps_nobody():
    clock = FakeClock()
    r = VersionRouter({"v1": 0.5, "v2": 0.5}, salt="m", stickiness_window_s=600, clock=clock)
    on_v2 = [u for u in (f"u{i}" for i in range(200)) if r.route(u).version == "v2"]
    r.set_weights({"v1": 1.0, "v2": 0.0})  # rolled back
    assert on_v2 and {r.route(u).version for u in on_v2} == {"v1"}


def test_pins_are_bounded_least_recently_seen_first():
    r = VersionRouter({"v1": 1.0}, stickiness_window_s=600, max_pinned=3)
    for u in ("a", "b", "c", "a", "d"):
        r.route(u)
    assert r.pinned() == 3 and r.route("a").reason is RouteReason.PINNED
    assert r.route("b").reason is RouteReason.STICKY  # forgotten
