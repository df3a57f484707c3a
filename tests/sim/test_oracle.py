"""The oracle: a schedule with perfect knowledge of the trace, to price policies against."""

from llmserve.autoscale import AutoscaleConfig, BoundsConfig, SLOConfig, StaticConfig
from llmserve.sim.oracle import SchedulePolicy, fluid_counts, oracle
from llmserve.sim.simulator import SimConfig, Simulator
from llmserve.sim.traces import LengthDist, flash

from .test_simulator import small_profile


def test_a_schedule_starts_each_bins_instances_one_lead_time_ahead():
    p = SchedulePolicy(counts=(1, 1, 4, 4, 2), bin_s=100.0, lead_s=30.0)
    assert p.desired_at(50.0) == 1
    assert p.desired_at(175.0) == 4  # bin 2 starts at 200: its instances are started by 170
    assert p.desired_at(390.0) == 4
    assert p.desired_at(401.0) == 2   # the moment bin 3 is over, its extra instances go
    assert p.desired_at(10_000.0) == 2


def _trace():
    return flash(base_rps=4.0, factor=5.0, rise_s=30.0, hold_s=300.0, crowds_at=(600.0,), duration_s=1500.0,
                 prompt=LengthDist(60, 0.7, 4, 400), output=LengthDist(40, 0.7, 2, 300))


def test_the_oracle_meets_the_target_for_less_than_a_pool_sized_for_the_crowd():
    trace, profile = _trace(), small_profile()
    cfg = AutoscaleConfig(slo=SLOConfig(ttft_s=2.0, e2e_s=300.0), tick_s=5.0)
    best = oracle(trace, profile, cfg, target=0.999, bin_s=60.0)
    assert best.summary.ttft_attainment >= 0.999
    counts = fluid_counts(trace, profile, 60.0)
    peak = max(counts)
    assert peak >= 4 * counts[0]  # the crowd needs several times the base
    static_cfg = cfg.model_copy(update={"policy": "static", "static": StaticConfig(instances=peak),
                                        "bounds": BoundsConfig(min_instances=1, max_instances=100)})
    fixed = Simulator(trace, profile, static_cfg, SimConfig(initial_instances=peak)).run()
    assert best.summary.instance_hours < 0.8 * fixed.summary.instance_hours
