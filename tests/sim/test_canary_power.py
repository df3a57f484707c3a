"""What the canary analysis guarantees, measured over seeded rollouts of the real
analysis (sim/canary_power.py) at the settings of issue 36."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmserve.gateway.canary import CanaryConfig
from llmserve.sim.canary_power import Traffic, power, rollout

# The settings of the run in which a canary failing 60 % of its requests was promoted.
ISSUE = CanaryConfig(start_weight=0.3, step_weight=0.2, max_weight=0.5, interval_s=1,
                     failure_threshold=2, min_requests=3, latency_slack_s=0.05)
ROLLOUTS = 1000


def test_a_canary_failing_60_percent_is_promoted_in_at_most_1_percent():
    p = power(ISSUE, Traffic(rps=10, canary_error_rate=0.6), ROLLOUTS, seed=1)
    assert p.promoted <= 0.01
    assert p.rolled_back >= 0.99  # and quickly: a few seconds of traffic
    assert p.p95_s <= 30


def test_five_points_more_errors_than_a_1_percent_stable_is_promoted_in_at_most_5_percent():
    p = power(ISSUE, Traffic(rps=40, stable_error_rate=0.01, canary_error_rate=0.06),
              ROLLOUTS, seed=2)
    assert p.promoted <= 0.05
    assert p.rolled_back >= 0.95


def test_a_healthy_canary_is_rolled_back_in_at_most_1_percent_and_promoted_otherwise():
    p = power(ISSUE, Traffic(rps=100, stable_error_rate=0.01, canary_error_rate=0.01),
              ROLLOUTS, seed=3)
    assert p.rolled_back <= 0.01
    assert p.promoted >= 0.99  # the limit (an hour) hides no late rollback


@pytest.mark.parametrize("traffic", [Traffic(canary_slowdown=3.0), Traffic(canary_output_tokens=1)])
def test_a_slow_or_terse_canary_is_rolled_back(traffic):
    assert rollout(ISSUE, traffic, seed=4).state == "rolled_back"


def test_rollouts_are_reproducible_from_their_seed():
    t = Traffic(rps=10, stable_error_rate=0.01, canary_error_rate=0.03)
    assert rollout(ISSUE, t, seed=7) == rollout(ISSUE, t, seed=7)


def test_the_command_prints_the_table_and_reads_a_gateway_file(tmp_path):
    """``llmserve simulate --canary-power`` as docs/canary.md shows it (fewer rollouts)."""
    gateway = tmp_path / "gateway.yaml"
    gateway.write_text(yaml.safe_dump({"models": [{"name": "m", "versions": [], "canary": {
        "version": "c", "stable": "v1", "auto_start": True, **ISSUE.model_dump(
            include={"start_weight", "step_weight", "max_weight", "interval_s",
                     "failure_threshold", "min_requests", "latency_slack_s"})}}]}))
    cmd = [str(Path(sys.executable).with_name("llmserve")), "simulate", "--canary-power",
           "--canary-rollouts", "20", "--canary-rps", "10", "--canary-settings", str(gateway),
           "--canary-stable-error-rate", "0.01", "--canary-worse-by", "0.6",
           "--canary-slower-by", "2", "--out", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True).stdout
    assert "steps [0.3, 0.5], interval 1 s" in out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert set(rows) >= {"healthy", "errors +0.6", "2x slower"}
    assert "| errors +0.6 | 0.0% | 100.0% |" in out
    saved = json.loads((tmp_path / "canary_power.json").read_text())
    assert saved["settings"]["min_requests"] == 3 and len(saved["scenarios"]) == 3
