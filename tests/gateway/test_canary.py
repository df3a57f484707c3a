"""The canary analysis's state machine over accumulated evidence (gateway/canary.py)."""

import random

import pytest

from llmserve.gateway.canary import (Action, CanaryAnalysis, CanaryConfig, CanaryState,
                                     InvalidTransition, evaluate)
from llmserve.gateway.canary_evidence import Outcome, VersionEvidence
from llmserve.gateway.canary_stats import Verdict

CFG = CanaryConfig(start_weight=0.05, step_weight=0.05, max_weight=0.2, interval_s=60,
                   failure_threshold=3, min_requests=20)


def _started(cfg=CFG) -> CanaryAnalysis:
    a = CanaryAnalysis("canary", "v1", cfg)
    a.start(now=0.0)
    return a


def _feed(a: CanaryAnalysis, t: float, n: int, *, canary_error=0.0, stable_error=0.0,
          canary_ttft=0.1, rng=None) -> None:
    """``n`` outcomes per version at time ``t`` (errors drawn from ``rng``)."""
    rng = rng or random.Random(0)
    for version, p, ttft in (("canary", canary_error, canary_ttft), ("v1", stable_error, 0.1)):
        for _ in range(n):
            if rng.random() < p:
                a.record(version, t, Outcome(error="upstream_5xx"))
            else:
                a.record(version, t, Outcome(ttft_s=ttft * (0.9 + 0.2 * rng.random()),
                                             e2e_s=1.0 + 0.1 * rng.random(), output_tokens=8))


def test_steps_run_from_start_to_max():
    assert CFG.steps() == [0.05, 0.1, 0.15, 0.2]
    assert CanaryConfig(start_weight=0.1, step_weight=0.25, max_weight=0.5).steps() == \
        [0.1, 0.35, 0.5]
    with pytest.raises(ValueError):
        CanaryConfig(start_weight=0.6, max_weight=0.5)


def test_a_clean_canary_advances_only_once_the_evidence_bounds_its_error_rate():
    """No error in 20 requests is no proof of a rate under 1 %: the look is inconclusive
    until the bound is inside the margin (about 600 clean requests each at 99 %)."""
    a = _started()
    _feed(a, 1.0, 20)
    d = a.tick(60.0)
    assert (d.action, d.weight) == (Action.INCONCLUSIVE, 0.05)
    assert a.settled.keys() >= {"TTFT", "e2e", "output tokens"}  # latencies settle early
    assert "error rate" not in a.settled
    assert a.evidence["canary"].requests == 20  # nothing reset
    _feed(a, 61.0, 700)
    d = a.tick(120.0)
    assert (d.action, d.weight) == (Action.ADVANCE, 0.1)
    assert a.evidence["canary"].requests == 0 and not a.settled  # the next step collects anew
    assert "pass: error rate canary 0/720" in d.reason and "at 99% each side" in d.reason


def test_the_issue_case_a_few_clean_requests_of_a_bad_canary_never_pass():
    """Issue 36: three requests without an error passed a check; now they decide nothing."""
    cfg = CFG.model_copy(update={"min_requests": 3})
    a = _started(cfg)
    for k in range(1, 30):
        _feed(a, 60.0 * k - 1, 3)
        assert a.tick(60.0 * k).action is Action.INCONCLUSIVE
    assert a.weight == 0.05 and a.failed_checks == 0


def test_an_erroring_canary_holds_afresh_then_rolls_back_after_threshold():
    a = _started()
    rng = random.Random(1)
    actions = []
    for k in (1, 2, 3):
        _feed(a, 60.0 * k - 1, 60, canary_error=0.6, rng=rng)
        actions.append(a.tick(60.0 * k))
    assert [d.action for d in actions] == [Action.HOLD, Action.HOLD, Action.ROLLBACK]
    assert [d.weight for d in actions] == [0.05, 0.05, 0.0]
    assert (a.state, a.weight, a.failed_checks) == (CanaryState.ROLLED_BACK, 0.0, 3)
    reason = actions[-1].reason
    assert "check failed (3/3)" in reason and "error rate canary" in reason
    assert "upstream_5xx" in reason and "margin 0.01" in reason
    assert [e["action"] for e in a.events()] == ["start", "hold", "hold", "rollback"]


def test_a_hold_restarts_the_step_so_each_failed_check_is_a_fresh_test():
    a = _started()
    _feed(a, 59.0, 60, canary_error=0.6, rng=random.Random(2))
    assert a.tick(60.0).action is Action.HOLD
    assert a.evidence["canary"].requests == 0
    assert a.tick(120.0).action is Action.INCONCLUSIVE  # no new evidence: nothing decided


def test_a_slow_canary_fails_on_the_rank_test_and_a_fast_one_settles():
    slow = _started()
    _feed(slow, 59.0, 40, canary_ttft=0.3)
    d = slow.tick(60.0)
    assert d.action is Action.HOLD and "TTFT median canary" in d.reason
    fast = _started()
    _feed(fast, 59.0, 40, canary_ttft=0.1)
    assert fast.tick(60.0).action is Action.INCONCLUSIVE and "TTFT" in fast.settled


def test_an_output_length_collapse_fails():
    a = _started()
    for _ in range(30):
        a.record("canary", 1.0, Outcome(ttft_s=0.1, e2e_s=0.2, output_tokens=1))
        a.record("v1", 1.0, Outcome(ttft_s=0.1, e2e_s=0.2, output_tokens=40))
    d = a.tick(60.0)
    assert d.action is Action.HOLD and "output tokens" in d.reason


def test_refusals_the_stable_version_does_not_give_fail():
    a = _started()
    for i in range(60):
        a.record("canary", 1.0, Outcome(refused=i % 2 == 0))
        a.record("v1", 1.0, Outcome())
    d = a.tick(60.0)
    assert d.action is Action.HOLD and "refusal rate canary 30/60" in d.reason


def test_the_error_ratio_guard_only_fails_and_only_when_stable_errs():
    cfg = CFG.model_copy(update={"max_error_rate_delta": None})
    c, s = VersionEvidence(), VersionEvidence()
    c.add_counts(0.0, 4000, {"upstream_5xx": 400})
    s.add_counts(0.0, 4000, {"upstream_5xx": 100})
    j = evaluate(cfg, c, s)
    assert j.verdict is Verdict.FAIL and "canary - 2 x stable" in j.reasons[0]
    c2 = VersionEvidence()
    c2.add_counts(0.0, 4000, {"upstream_5xx": 100})
    assert all(f.signal != "error rate ratio" for f in evaluate(cfg, c2, s).findings)


def test_min_requests_is_a_floor_under_fail_too():
    a = _started()
    for _ in range(5):
        a.record("canary", 1.0, Outcome(error="upstream_5xx"))
        a.record("v1", 1.0, Outcome(ttft_s=0.1))
    d = a.tick(60.0)
    assert d.action is Action.INCONCLUSIVE and "below the floor of 20" in d.reason


def test_outcomes_outside_a_progressing_rollout_are_not_kept():
    a = CanaryAnalysis("canary", "v1", CFG)
    a.record("canary", 0.0, Outcome(error="x"))
    a.start(1.0)
    a.record("other", 1.0, Outcome(error="x"))
    assert a.evidence["canary"].requests == 0
    a.pause(2.0)
    a.record("canary", 3.0, Outcome(error="x"))
    assert a.evidence["canary"].requests == 0


def test_pause_freezes_and_resume_waits_a_full_interval():
    a = _started()
    a.pause(10.0)
    assert a.tick(100.0).action is Action.NONE
    a.resume(200.0)
    assert a.tick(230.0).action is Action.NONE
    _feed(a, 240.0, 60, canary_error=0.6, rng=random.Random(3))
    assert a.tick(260.0).action is Action.HOLD


def test_manual_promote_and_rollback_and_restart():
    a = _started()
    a.pause(11.0)
    d = a.rollback(12.0)
    assert (d.weight, a.state) == (0.0, CanaryState.ROLLED_BACK)
    a.start(13.0)  # a rolled-back canary may be tried again
    assert (a.state, a.weight, a.failed_checks) == (CanaryState.PROGRESSING, 0.05, 0)
    d = a.promote(15.0, reason="looks fine to me")
    assert (d.action, d.weight, a.state) == (Action.PROMOTE, 1.0, CanaryState.PROMOTED)
    assert a.events()[-1]["reason"] == "looks fine to me"


def test_a_promoted_canary_is_the_stable_and_is_not_restarted():
    # Restarting used to set the weight back to start_weight: 95% of traffic to the retired stable.
    a = _started()
    a.promote(5.0)
    with pytest.raises(InvalidTransition, match="promoted and is the stable now: a new rollout needs a new canary"):
        a.start(10.0)
    assert (a.state, a.weight) == (CanaryState.PROMOTED, 1.0)


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
        a.tick(60.0 * k)
    assert len(a.events()) == 3


def test_status_reports_state_evidence_and_last_result():
    a = _started()
    _feed(a, 59.0, 60, canary_error=0.6, rng=random.Random(4))
    a.tick(60.0)
    s = a.status()
    assert s["state"] == "progressing" and s["failed_checks"] == 1 and s["weight"] == 0.05
    assert s["last_result"]["verdict"] == "fail" and s["steps"] == CFG.steps()
    assert s["evidence"]["canary"]["requests"] == 0 and s["confidence"] == 0.99


def test_an_interval_the_canary_pool_could_not_serve_is_set_aside():
    a = _started()
    _feed(a, 30.0, 60, canary_error=0.6, rng=random.Random(5))
    d = a.tick(60.0, not_judged="not judged: the canary pool has no ready instance")
    assert d.action is Action.SKIP and a.failed_checks == 0 and a.weight == 0.05
    assert "120 outcomes set aside" in a.events()[-1]["reason"]
    assert a.evidence["canary"].requests == 0
    assert a.tick(61.0).action is Action.NONE  # a fresh interval first
    _feed(a, 100.0, 20)
    assert a.tick(120.0).action is Action.INCONCLUSIVE
    assert a.evidence["canary"].requests == 20
