"""The live soak's pure parts: its trace, per-policy configs and figures (no serving here)."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from llmserve.sim.fidelity import Row
from llmserve.sim.traces import LengthDist

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "autoscale" / "soak.py"
_spec = importlib.util.spec_from_file_location("soak", _PATH)
soak = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(soak)

LENGTHS = (LengthDist(32, 0.5, 4, 256), LengthDist(16, 0.5, 2, 128))


def test_the_day_runs_trough_peak_trough_with_a_burst():
    d = 1200.0
    t = np.array([0.0, 0.25 * d, 0.5 * d, 0.69 * d, 0.71 * d, 0.99 * d])
    r = soak.soak_rate(t, d, 0.1, 1.0, 3.0)
    assert r[0] == pytest.approx(0.1) and r[2] == pytest.approx(1.0)
    assert r[1] == pytest.approx(0.55)
    assert r[4] == pytest.approx(3.0 * soak.soak_rate(t[4:5], d, 0.1, 1.0, 1.0)[0])  # inside the burst
    assert r[3] < r[4] / 2
    assert r[5] < 0.11


def test_trace_is_reproducible_and_busier_at_noon():
    a = soak.soak_trace(10, 0.1, 1.0, 2.0, *LENGTHS, seed=1)
    b = soak.soak_trace(10, 0.1, 1.0, 2.0, *LENGTHS, seed=1)
    assert np.array_equal(a.arrival_s, b.arrival_s) and a.duration_s == 600.0
    first, middle = np.sum(a.arrival_s < 100), np.sum((a.arrival_s >= 250) & (a.arrival_s < 350))
    assert middle > 2 * first


def test_bad_days_are_refused():
    with pytest.raises(ValueError):
        soak.soak_rate(np.zeros(1), 60.0, 1.0, 0.5, 2.0)
    with pytest.raises(ValueError):
        soak.policy_config({}, "autopilot")


def test_policy_config_sets_only_the_policy():
    base = {"model": "m", "autoscale": {"policy": "predictive", "kpa": {"stable_window_s": 20.0}}}
    cfg = soak.policy_config(base, "kpa")
    assert cfg["autoscale"] == {"policy": "kpa", "kpa": {"stable_window_s": 20.0}}
    assert base["autoscale"]["policy"] == "predictive"


def test_attainment_counts_failed_requests_as_misses():
    assert soak.attainment(np.array([0.5, 1.5, np.nan, 3.0]), 2.0) == pytest.approx(0.5)


def test_held_curve_counts_open_and_closed_spans():
    spans = [(0.0, None), (10.0, 20.0)]
    assert soak.held_curve(spans, np.array([5.0, 15.0, 25.0]), 30.0).tolist() == [1, 2, 1]


def test_policy_summary_reports_losses_and_instance_seconds():
    rows = [Row("instance-seconds", "instance_seconds", "{:.1f}", 100.0, 104.0)]
    s = soak.policy_summary("kpa", 10, 9, np.array([1.0] * 9 + [np.nan]), np.array([1.0] * 10), rows, 2.0)
    assert s["failed"] == 1
    assert s["live_ttft_attainment"] == pytest.approx(0.9) and s["sim_ttft_attainment"] == 1.0
    assert s["instance_seconds_relative"] == pytest.approx(0.04)
