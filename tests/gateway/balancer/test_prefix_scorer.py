import pytest

from llmserve.gateway.balancer import (PrefixAffinityScorer, PrefixConfig, RouteRequest,
                                       prefix_hashes)

CFG = PrefixConfig(block_chars=4, max_blocks=8, table_size=1000, imbalance_abs=2,
                   imbalance_ratio=0.0)


def test_prefix_hashes_chain_and_ignore_a_partial_block():
    a = prefix_hashes("aaaabbbbcc", 4, 8)
    b = prefix_hashes("aaaabbbbdd", 4, 8)
    c = prefix_hashes("xxxxbbbb", 4, 8)
    assert len(a) == 2 and a == b
    assert a[1] != c[1]  # same second block, different first: different chain hash
    assert len(prefix_hashes("a" * 100, 4, 8)) == 8
    assert prefix_hashes("abc", 4, 8) == []


def test_the_instance_that_served_a_prefix_scores_by_shared_length(make_instance):
    s = PrefixAffinityScorer(CFG)
    a, b = make_instance("a"), make_instance("b")
    s.on_picked(RouteRequest("SYSPROMPTuser1"), a)  # blocks SYSP ROMP TUSE (+ r1)
    assert s.score(RouteRequest("SYSPROMPTuser1"), [a, b]) == [1.0, 0.0]
    # shares 2 of its 3 blocks with what a served
    assert s.score(RouteRequest("SYSPROMPxxxxx"), [a, b]) == pytest.approx([2 / 3, 0.0])
    assert s.score(RouteRequest("unrelated prompt"), [a, b]) == [0.0, 0.0]
    assert s.score(RouteRequest("abc"), [a, b]) == [0.0, 0.0]  # shorter than a block


def test_imbalance_guard_ignores_affinity_to_an_overloaded_instance(make_instance):
    s = PrefixAffinityScorer(CFG)
    req = RouteRequest("hot system prompt")
    hot_idle = make_instance("hot", inflight=2)
    s.on_picked(req, hot_idle)
    cold = make_instance("cold", inflight=0)
    assert s.score(req, [hot_idle, cold])[0] == 1.0  # 2 over the least: within margin
    hot_busy = make_instance("hot", inflight=3)
    assert s.score(req, [hot_busy, cold]) == [0.0, 0.0]


def test_ratio_margin_scales_with_load(make_instance):
    s = PrefixAffinityScorer(CFG.model_copy(update={"imbalance_abs": 0, "imbalance_ratio": 0.5}))
    req = RouteRequest("some long prompt")
    s.on_picked(req, make_instance("a"))
    assert s.score(req, [make_instance("a", inflight=15), make_instance("b", inflight=10)])[0] == 1.0
    assert s.score(req, [make_instance("a", inflight=16), make_instance("b", inflight=10)])[0] == 0.0


def test_table_is_lru_bounded_and_forget_drops_an_instance(make_instance):
    s = PrefixAffinityScorer(CFG.model_copy(update={"table_size": 4, "max_blocks": 2}))
    a, b = make_instance("a"), make_instance("b")
    s.on_picked(RouteRequest("11112222"), a)
    s.on_picked(RouteRequest("33334444"), b)
    assert len(s) == 4
    s.on_picked(RouteRequest("55556666"), b)  # evicts the oldest: a's entries
    assert len(s) == 4
    assert s.score(RouteRequest("11112222"), [a, b]) == [0.0, 0.0]
    assert s.score(RouteRequest("33334444"), [a, b]) == [0.0, 1.0]
    s.forget("b")
    assert len(s) == 0


def test_repeat_picks_count_as_hits(make_instance):
    s = PrefixAffinityScorer(CFG)
    a = make_instance("a")
    s.on_picked(RouteRequest("same prefix here"), a)
    s.on_picked(RouteRequest("same prefix here"), a)
    s.on_picked(RouteRequest("same prefix here"), make_instance("b"))
    assert s.hits == 1
