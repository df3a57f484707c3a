import pytest

from llmserve.gateway.balancer import BusyScorer, RouteRequest


def test_lowest_busy_fraction_scores_highest_and_unknown_is_neutral(make_instance):
    cands = [make_instance("a", report={"busy_fraction": 1.0}),
             make_instance("b", report={"busy_fraction": 0.25}), make_instance("c")]
    assert BusyScorer().score(RouteRequest(), cands) == pytest.approx([0.0, 0.75, 0.5])
