"""The tests behind a canary verdict (gateway/canary_stats.py) and the evidence they
read (gateway/canary_evidence.py), against published values."""

import numpy as np
import pytest

from llmserve.gateway.canary_evidence import Outcome, VersionEvidence
from llmserve.gateway.canary_stats import (Verdict, excess_bounds, proportion_test, rank_test,
                                           rank_z, wilson, z_of)

Z95 = 1.959964  # two-sided 95 %: the published examples


def test_wilson_matches_newcombes_table():
    # Newcombe (1998), single proportion, Table I: 0/10 -> 0 to 0.2775; 1/29 -> 0.0061 to 0.1718.
    assert wilson(0, 10, Z95) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(1, 29, Z95) == pytest.approx((0.0061, 0.1718), abs=1e-4)


def test_the_difference_bound_matches_newcombes_method_10():
    # Newcombe (1998), difference of independent proportions, Table II, example (a):
    # 56/70 - 48/80: 0.0524 to 0.3339 by the hybrid score method.
    assert excess_bounds(56, 70, 48, 80, Z95) == pytest.approx((0.0524, 0.3339), abs=1e-4)


def test_a_proportion_test_passes_fails_or_waits_by_its_bound():
    ok = proportion_test("error rate", 0, 2000, 0, 2000, margin=0.01, confidence=0.99, floor=20)
    bad = proportion_test("error rate", 12, 20, 0, 40, margin=0.01, confidence=0.99, floor=20)
    few = proportion_test("error rate", 0, 50, 0, 50, margin=0.01, confidence=0.99, floor=20)
    assert (ok.verdict, bad.verdict, few.verdict) == (Verdict.PASS, Verdict.FAIL, Verdict.INCONCLUSIVE)
    assert "canary 12/20 (0.600) vs stable 0/40 (0.000)" in bad.detail and "at 99% each side" in bad.detail


def test_rank_z_is_the_mann_whitney_normal_score():
    # U = 0 for fully separated samples of 5 and 5: z = (0 - 12.5 + 0.5) / sqrt(25 * 11 / 12)
    z, share = rank_z(np.arange(5.0), np.arange(5.0) + 10)
    assert z == pytest.approx(-12 / np.sqrt(25 * 11 / 12)) and share == 0.0
    z, share = rank_z(np.ones(4), np.ones(4))
    assert (z, share) == (0.0, 0.5)  # all tied: no evidence


def test_a_rank_test_shifts_stable_to_the_margin():
    rng = np.random.default_rng(0)
    stable = list(0.1 * rng.lognormal(0, 0.3, 200))
    same = list(0.1 * rng.lognormal(0, 0.3, 200))
    slow = list(0.2 * rng.lognormal(0, 0.3, 200))
    kw = dict(ratio=1.5, slack=0.0, confidence=0.99, floor=20)
    assert rank_test("TTFT", same, stable, **kw).verdict is Verdict.PASS
    assert rank_test("TTFT", slow, stable, **kw).verdict is Verdict.FAIL
    short = rank_test("output tokens", [1.0] * 30, [10.0] * 30, ratio=0.6, slack=0.0,
                      confidence=0.99, floor=20, higher_is_worse=False, unit="tokens")
    assert short.verdict is Verdict.FAIL
    assert z_of(0.99) == pytest.approx(2.3263, abs=1e-4)


def test_evidence_counts_kinds_and_takes_back_an_interval():
    ev = VersionEvidence(max_samples=3)
    ev.add(1.0, [Outcome(error="upstream_5xx"), Outcome(ttft_s=0.1, output_tokens=4)])
    ev.add_counts(2.0, 5, {"upstream_broken": 1}, refusals=1, ttft_s=[0.2, 0.3, 0.4])
    assert (ev.requests, ev.errors, ev.refusals) == (7, 2, 1)
    assert ev.samples("ttft_s") == [0.1, 0.2]  # three outcomes' samples kept at most
    assert ev.drop_since(2.0) == 5
    assert (ev.requests, dict(ev.error_kinds), ev.refusals) == (2, {"upstream_5xx": 1}, 0)
    ev.add_counts(3.0, 1, ttft_s=[0.5])
    assert ev.samples("ttft_s") == [0.1, 0.5]
    with pytest.raises(ValueError):
        ev.add_counts(4.0, 1, latency=[1.0])
