from llmserve.gateway.balancer import QueueScorer, RouteRequest, lower_is_better


def test_fewest_waiting_scores_highest(make_instance):
    cands = [make_instance("a", report={"num_waiting": 4}), make_instance("b", report={"num_waiting": 0}),
             make_instance("c", report={"num_waiting": 2})]
    assert QueueScorer().score(RouteRequest(), cands) == [0.0, 1.0, 0.5]


def test_all_equal_all_score_one_and_missing_report_counts_as_empty(make_instance):
    cands = [make_instance("a"), make_instance("b", report={"num_waiting": 0})]
    assert QueueScorer().score(RouteRequest(), cands) == [1.0, 1.0]


def test_lower_is_better_bounds():
    assert lower_is_better([]) == []
    assert lower_is_better([5.0]) == [1.0]
    assert all(0.0 <= s <= 1.0 for s in lower_is_better([3, 100, 7, 0]))
