"""``--jobs``: the policies (the oracle too) run in child processes give the table one process gives."""

from __future__ import annotations

import json

import numpy as np

from llmserve.sim.cli import main
from llmserve.sim.jobs import from_plain, simulate_one, to_plain
from llmserve.sim.simulator import SimConfig
from llmserve.autoscale import AutoscaleConfig
from llmserve.sim.profile import load_profile
from llmserve.sim.traces import build_trace

_ARGV = ["--trace", "diurnal", "--hours", "0.25", "--peak-rps", "3", "--policy", "threshold,oracle,kpa,static",
         "--cold-start", "60", "--static-instances", "3", "--no-plots", "--no-progress"]


def _rows(out) -> list[dict]:
    rows = json.loads((out / "summary.json").read_text())["runs"]
    for r in rows:
        r.pop("wall_s"), r.pop("cpu_s")
    return rows


def test_jobs_merge_the_same_table_as_one_process(tmp_path) -> None:
    assert main([*_ARGV, "--jobs", "1", "--out", str(tmp_path / "one")]) == 0
    assert main([*_ARGV, "--jobs", "2", "--out", str(tmp_path / "two")]) == 0
    one, two = _rows(tmp_path / "one"), _rows(tmp_path / "two")
    # the order asked for (the oracle runs first in a child of its own, its row stays where asked)
    assert [r["policy"] for r in two] == ["threshold", "oracle", "kpa", "static-3"]
    assert one == two
    assert any(r["scale_events"] for r in one)  # the elastic runs decided something


def test_plain_round_trip_keeps_every_outcome() -> None:
    trace = build_trace("diurnal", seed=1, peak_rps=2.0, duration_s=600.0)
    res = simulate_one(trace, load_profile("cpu-smollm2"), AutoscaleConfig(), SimConfig(), "kpa", 2, 1)
    back = from_plain(to_plain(res), trace)
    assert back.summary == res.summary
    for k in ("status", "ttft", "e2e", "timeline"):
        np.testing.assert_array_equal(getattr(back, k), getattr(res, k))
    assert back.events == res.events and back.lifetimes == res.lifetimes
