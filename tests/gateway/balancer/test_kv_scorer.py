import pytest

from llmserve.gateway.balancer import KVScorer, RouteRequest


def test_lowest_kv_use_scores_highest_and_unknown_is_neutral(make_instance):
    cands = [make_instance("a", report={"kv_cache_usage": 0.9}),
             make_instance("b", report={"kv_cache_usage": 0.1}), make_instance("c")]
    assert KVScorer().score(RouteRequest(), cands) == pytest.approx([0.1, 0.9, 0.5])
