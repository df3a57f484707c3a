"""Spot capacity in the simulator: the live mix, seeded reclaims handled like a notice, cost in money."""

from dataclasses import replace

import numpy as np

from llmserve.autoscale import AutoscaleConfig, StaticConfig
from llmserve.autoscale.capacity_classes import CapacityConfig, SpotConfig
from llmserve.sim.results import RECLAIMED
from llmserve.sim.simulator import SimConfig, Simulator

from .test_simulator import UNLIMITED, short_trace, small_profile

SPOT = CapacityConfig(spot=SpotConfig(max_instances=None, price_per_hour=0.25))


def run(n=4, capacity=None, rate=0.0, notice=60.0, seed=0, trace=None):
    auto = AutoscaleConfig(policy="static", static=StaticConfig(instances=n),
                           **({"capacity": capacity} if capacity is not None else {}))
    sim = SimConfig(initial_instances=n, seed=seed, reclaim_rate_per_h=rate, reclaim_notice_s=notice)
    return Simulator(trace or short_trace(seed), small_profile(), auto, sim, admission=UNLIMITED).run()


def test_without_spot_cost_is_the_instance_hours_at_the_on_demand_price():
    s = run().summary
    assert s.spot_hours == 0 and s.reclaims == 0
    assert abs(s.cost_dollars - s.instance_hours * 1.0) < 1e-9


def test_the_base_stays_on_demand_and_the_rest_is_billed_at_the_spot_price():
    res = run(capacity=SPOT)
    s = res.summary
    hours = s.duration_h
    assert abs(s.spot_hours - 3 * hours) < 1e-6  # base 1 (min_instances) on on-demand, 3 on spot
    assert abs(s.cost_dollars - (hours * 1.0 + 3 * hours * 0.25)) < 1e-6


def test_each_reclaim_is_replaced_at_its_notice_so_the_pool_never_counts_short():
    res = run(capacity=SPOT, rate=6.0, notice=30.0)  # a reclaim per spot instance every 10 minutes
    s = res.summary
    assert s.reclaims >= 5
    provisioned = res.column("ready") + res.column("coming")
    assert np.all(provisioned[1:] == 4)  # a replacement started at the notice, not at the next tick
    assert s.spot_hours > 3 * s.duration_h * 0.99  # replacements of spot go back to spot


def test_requests_still_running_at_the_deadline_are_cut_and_count_as_misses():
    busy = short_trace(0, low_rps=3.0, high_rps=6.0)
    res = run(n=3, capacity=SPOT, rate=12.0, notice=0.0, trace=busy)
    s = res.summary
    assert s.reclaimed == int(np.sum(res.status == RECLAIMED)) > 0
    assert s.ttft_attainment <= 1 - s.reclaimed / s.requests


def test_reclaims_are_seeded():
    a = run(capacity=SPOT, rate=6.0, seed=3).summary
    b = run(capacity=SPOT, rate=6.0, seed=3).summary
    c = run(capacity=SPOT, rate=6.0, seed=4).summary
    assert replace(a, wall_s=0, cpu_s=0) == replace(b, wall_s=0, cpu_s=0)
    assert (a.reclaims, a.cost_dollars) != (c.reclaims, c.cost_dollars)
