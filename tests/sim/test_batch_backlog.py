"""The simulated backlog: every line once, released at the runner's pace, and the
realtime requests of a static pool unchanged in number and close in latency."""

from __future__ import annotations

import argparse

import numpy as np

from llmserve.sim.batch_backlog import Backlog, BacklogSimulator, compare_day, report, with_backlog
from llmserve.sim.cli import add_simulate_args, autoscale_from_args, sim_from_args, trace_from_args
from llmserve.sim.compare import initial_instances
from llmserve.sim.profile import load_profile
from llmserve.sim.results import COMPLETED
from llmserve.sim.simulator import SimConfig, Simulator
from tests.sim.test_simulator import short_trace, small_profile, static


def test_with_backlog_adds_the_lines_in_order():
    trace = short_trace()
    joined, mask = with_backlog(trace, Backlog(50, submit_s=100.0, prompt_tokens=20, output_tokens=10))
    assert len(joined) == len(trace) + 50 and mask.sum() == 50
    assert np.all(joined.arrival_s[mask] == 100.0) and np.all(joined.priority[mask] == 1)
    np.testing.assert_array_equal(joined.arrival_s[~mask], trace.arrival_s)


def test_every_line_completes_once_and_never_more_than_the_base_in_flight():
    trace = short_trace()
    backlog = Backlog(200, submit_s=0.0, prompt_tokens=20, output_tokens=10, base=2)
    sim = BacklogSimulator(trace, backlog, small_profile(), static(2), SimConfig(initial_instances=2))
    peak = 0
    release = sim._release

    def watched(now):
        nonlocal peak
        release(now)
        peak = max(peak, sim.in_flight)

    sim._release = watched
    res = sim.run()
    assert np.all(res.status[sim.is_line] == COMPLETED) and sim.finished == 200
    assert peak == 4  # a day-long window needs no more than the base: 2 per ready instance, 2 instances
    assert sim.done_at > 0
    plain = report(Simulator(trace, small_profile(), static(2), SimConfig(initial_instances=2)).run(), None, 2.0)
    busy = report(res, sim.is_line, 2.0, 0.0, sim.done_at)
    assert busy.batch_lines == 200 and busy.batch_done_s == sim.done_at
    assert busy.realtime_ttft_attainment >= plain.realtime_ttft_attainment - 0.05


def test_a_window_too_short_for_the_base_widens_the_release():
    trace = short_trace()
    # about 10 lines/s at one in flight: 3,000 lines need 300 s, the window is 120 s
    backlog = Backlog(3000, submit_s=0.0, window_s=120.0, prompt_tokens=20, output_tokens=10, base=1, ceiling=8)
    sim = BacklogSimulator(trace, backlog, small_profile(), static(2), SimConfig(initial_instances=2))
    peak = 0
    release = sim._release

    def watched(now):
        nonlocal peak
        release(now)
        peak = max(peak, sim.in_flight)

    sim._release = watched
    sim.run()
    assert peak > 1 and sim.finished == 3000


def test_a_small_day_keeps_its_attainment_and_fills_idle_capacity():
    """Issue 33's target on a small day: a backlog whose window idle capacity can meet adds
    at most 5 % instance-hours, keeps realtime attainment and finishes within its window
    (-0.1 % measured with lines filling idle seats, realtime attainment 99.53 % against 99.70 %;
    +3.7 % with 4 lines in flight in all; the policies that counted batch arrivals as demand cost +10.4 %)."""
    ap = argparse.ArgumentParser()
    add_simulate_args(ap)
    args = ap.parse_args(["--trace", "diurnal", "--policy", "predictive", "--peak-rps", "0.15"])
    profile = load_profile(args.profile).with_cold_start(120.0)
    trace = trace_from_args(args)
    autoscale = autoscale_from_args(args, profile, trace).model_copy(update={"policy": "predictive"})
    sim = sim_from_args(args)
    sim = sim.model_copy(update={"initial_instances": initial_instances(trace, 1, autoscale.bounds.min_instances)})
    backlog = Backlog(1500, 0.0, 24 * 3600.0, int(trace.prompt_tokens.mean()), int(trace.output_tokens.mean()))
    without, with_ = compare_day(trace, backlog, profile, autoscale, sim)
    assert with_.batch_lines == 1500 and with_.batch_done_s is not None and with_.batch_done_s < 24 * 3600.0
    assert with_.instance_hours <= 1.05 * without.instance_hours
    assert with_.realtime_ttft_attainment >= without.realtime_ttft_attainment - 0.002
