from llmserve.gateway.balancer import RouteRequest, RunningScorer


def test_fewest_running_scores_highest(make_instance):
    cands = [make_instance("a", report={"num_running": 8}), make_instance("b", report={"num_running": 2})]
    assert RunningScorer().score(RouteRequest(), cands) == [0.0, 1.0]


def test_counts_what_this_gateway_sent_since_the_report(make_instance):
    # b reported 2 running but we have sent it 6 more since: 8, worse than a's 5
    cands = [make_instance("a", report={"num_running": 5}),
             make_instance("b", report={"num_running": 2}, inflight=6, inflight_at_report=0)]
    assert RunningScorer().score(RouteRequest(), cands) == [1.0, 0.0]
