import pytest

from llmserve.gateway.canary import (Action, CanaryAnalysis, CanaryConfig, CanaryState,
                                     InvalidTransition, evaluate)
from llmserve.gateway.window_stats import VersionStats, WindowStats

GOOD = VersionStats(requests=100, errors=0, ttft_p99=0.10, e2e_p99=1.0)
BAD_ERRORS = VersionStats(requests=100, errors=20, ttft_p99=0.10, e2e_p99=1.0)
SLOW = VersionStats(requests=100, errors=0, ttft_p99=0.30, e2e_p99=1.0)
QUIET = VersionStats(requests=3, errors=0, ttft_p99=0.10, e2e_p99=1.0)

CFG = CanaryConfig(start_weight=0.05, step_weight=0.05, max_weight=0.2, interval_s=60,
                   failure_threshold=3, min_requests=20)


def _started(cfg=CFG) -> CanaryAnalysis:
    a = CanaryAnalysis("canary", "v1", cfg)
    a.start(now=0.0)
    return a


def test_steps_run_from_start_to_max():
    assert CFG.steps() == [0.05, 0.1, 0.15, 0.2]
    assert CanaryConfig(start_weight=0.1, step_weight=0.25, max_weight=0.5).steps() == \
        [0.1, 0.35, 0.5]
    with pytest.raises(ValueError):
        CanaryConfig(start_weight=0.6, max_weight=0.5)


def test_healthy_canary_advances_each_interval_then_promotes():
    a = _started()
    assert (a.state, a.weight) == (CanaryState.PROGRESSING, 0.05)
    assert a.tick(30.0, GOOD, GOOD).action is Action.NONE  # interval not yet elapsed
    seen = []
    t = 0.0
    for _ in range(len(CFG.steps())):
        t += 60.0
        d = a.tick(t, GOOD, GOOD)
        seen.append((d.action, d.weight))
    assert seen == [(Action.ADVANCE, 0.1), (Action.ADVANCE, 0.15), (Action.ADVANCE, 0.2),
                    (Action.PROMOTE, 1.0)]
    assert a.state is CanaryState.PROMOTED
    assert a.tick(t + 600, BAD_ERRORS, GOOD).action is Action.NONE  # settled


def test_erroring_canary_holds_then_rolls_back_after_threshold():
    a = _started()
    actions = [a.tick(60.0 * k, BAD_ERRORS, GOOD) for k in (1, 2, 3)]
    assert [d.action for d in actions] == [Action.HOLD, Action.HOLD, Action.ROLLBACK]
    assert [d.weight for d in actions] == [0.05, 0.05, 0.0]
    assert (a.state, a.weight, a.failed_checks) == (CanaryState.ROLLED_BACK, 0.0, 3)
    assert "error rate" in actions[-1].reason and "3/3" in actions[-1].reason
    events = a.events()
    assert [e["action"] for e in events] == ["start", "hold", "hold", "rollback"]
    assert [e["timestamp"] for e in events] == [0.0, 60.0, 120.0, 180.0]


def test_failed_checks_count_over_the_whole_rollout():
    a = _started()
    seq = [BAD_ERRORS, GOOD, BAD_ERRORS, GOOD, BAD_ERRORS]
    actions = [a.tick(60.0 * (k + 1), s, GOOD).action for k, s in enumerate(seq)]
    assert actions == [Action.HOLD, Action.ADVANCE, Action.HOLD, Action.ADVANCE,
                       Action.ROLLBACK]


def test_slow_canary_fails_on_ttft_ratio():
    result = evaluate(CFG, SLOW, GOOD)
    assert not result.passed and not result.skipped
    assert any("TTFT p99" in r for r in result.reasons)


def test_latency_slack_forgives_millisecond_noise():
    fast = VersionStats(requests=100, errors=0, ttft_p99=0.002, e2e_p99=0.004)
    noisy = VersionStats(requests=100, errors=0, ttft_p99=0.006, e2e_p99=0.010)
    assert evaluate(CFG, noisy, fast).passed
    strict = CFG.model_copy(update={"latency_slack_s": 0.0})
    assert not evaluate(strict, noisy, fast).passed


def test_error_ratio_applies_only_when_stable_has_errors():
    cfg = CFG.model_copy(update={"max_error_rate_delta": None, "max_error_rate_ratio": 2.0})
    stable = VersionStats(requests=100, errors=2, ttft_p99=0.1, e2e_p99=1.0)
    assert not evaluate(cfg, VersionStats(100, 5, ttft_p99=0.1, e2e_p99=1.0), stable).passed
    assert evaluate(cfg, VersionStats(100, 3, ttft_p99=0.1, e2e_p99=1.0), stable).passed
    assert evaluate(cfg, VersionStats(100, 5, ttft_p99=0.1, e2e_p99=1.0), GOOD).passed


def test_too_little_traffic_skips_without_counting():
    a = _started()
    for k in range(1, 6):
        d = a.tick(60.0 * k, QUIET, GOOD)
        assert (d.action, d.weight) == (Action.SKIP, 0.05)
    assert a.failed_checks == 0 and a.state is CanaryState.PROGRESSING
    assert "not enough traffic" in a.events()[-1]["reason"]


def test_pause_freezes_and_resume_waits_a_full_interval():
    a = _started()
    a.pause(10.0)
    assert a.tick(100.0, BAD_ERRORS, GOOD).action is Action.NONE
    a.resume(200.0)
    assert a.tick(230.0, GOOD, GOOD).action is Action.NONE
    assert a.tick(260.0, GOOD, GOOD).action is Action.ADVANCE


def test_manual_promote_and_rollback_and_restart():
    a = _started()
    d = a.promote(5.0, reason="looks fine to me")
    assert (d.action, d.weight, a.state) == (Action.PROMOTE, 1.0, CanaryState.PROMOTED)
    assert a.events()[-1]["reason"] == "looks fine to me"
    a.start(10.0)
    assert (a.state, a.weight, a.failed_checks) == (CanaryState.PROGRESSING, 0.05, 0)
    a.pause(11.0)
    d = a.rollback(12.0)
    assert (d.weight, a.state) == (0.0, CanaryState.ROLLED_BACK)


def test_invalid_transitions_raise():
    a = CanaryAnalysis("canary", "v1", CFG)
    for op in (a.pause, a.resume, a.promote, a.rollback):
        with pytest.raises(InvalidTransition):
            op(0.0)
    a.start(0.0)
    with pytest.raises(InvalidTransition):
        a.start(1.0)
    with pytest.raises(InvalidTransition):
        a.resume(1.0)


def test_history_is_bounded():
    a = _started(CFG.model_copy(update={"history_size": 3}))
    for k in range(1, 10):
        a.tick(60.0 * k, QUIET, GOOD)
    assert len(a.events()) == 3


def test_status_reports_state_and_last_result():
    a = _started()
    a.tick(60.0, BAD_ERRORS, GOOD)
    s = a.status()
    assert s["state"] == "progressing" and s["failed_checks"] == 1 and s["weight"] == 0.05
    assert s["last_result"]["passed"] is False and s["steps"] == CFG.steps()


def test_driven_by_window_stats_a_faulty_canary_is_rolled_back():
    """End to end over the pure parts: requests recorded with an injected clock."""
    stats = WindowStats(window_s=60)
    a = _started()
    t, decision = 0.0, None
    while a.state is CanaryState.PROGRESSING and t < 3600:
        t += 1.0
        for k in range(4):
            stats.record("v1", t, ok=True, ttft_s=0.05, e2e_s=0.5)
        stats.record("canary", t, ok=(int(t) % 5 != 0), ttft_s=0.05, e2e_s=0.5)  # 20% errors
        decision = a.tick(t, stats.snapshot("canary", t), stats.snapshot("v1", t))
    assert a.state is CanaryState.ROLLED_BACK and decision.weight == 0.0
    assert t == 180.0  # three failed checks, one per interval


def test_driven_by_window_stats_a_healthy_canary_is_promoted():
    stats = WindowStats(window_s=60)
    a = _started()
    t = 0.0
    while a.state is CanaryState.PROGRESSING and t < 3600:
        t += 1.0
        stats.record("v1", t, ok=True, ttft_s=0.05 + (t % 7) / 1000, e2e_s=0.5)
        stats.record("canary", t, ok=True, ttft_s=0.05 + (t % 5) / 1000, e2e_s=0.5)
        a.tick(t, stats.snapshot("canary", t), stats.snapshot("v1", t))
    assert a.state is CanaryState.PROMOTED and a.weight == 1.0
    assert t == 60.0 * len(CFG.steps())


def test_an_interval_the_canary_pool_could_not_serve_is_skipped_not_judged():
    a = _started()
    d = a.tick(60.0, BAD_ERRORS, GOOD, not_judged="not judged: the canary pool has no ready instance")
    assert d.action is Action.SKIP and a.failed_checks == 0 and a.weight == 0.05
    assert a.last_result.skipped and "no ready instance" in a.events()[-1]["reason"]
    assert a.tick(61.0, GOOD, GOOD).action is Action.NONE  # a fresh interval first
    assert a.tick(120.0, GOOD, GOOD).action is Action.ADVANCE
