"""A multi-version day replays its canary rollout: the live CanaryAnalysis on simulated outcomes."""

from __future__ import annotations

import numpy as np

from llmserve.sim.canary_replay import judge, split_by_schedule
from llmserve.sim.deployment import replay_deployment, simulate_deployment

from .test_deployment import deployment
from .test_simulator import short_trace, small_profile

PROFILE = small_profile(cold_start_s=5.0)
# Latency and length checks off and a 5-point error margin: the canary runs the same
# profile, so only traffic decides when it moves.
LENIENT = {"interval_s": 30.0, "step_weight": 0.1, "max_ttft_ratio": None, "max_e2e_ratio": None,
           "max_tpot_ratio": None, "min_output_ratio": None, "max_error_rate_delta": 0.05,
           "max_refusal_rate_delta": 0.05}


def test_a_passing_canary_steps_up_to_max_weight_and_is_promoted_and_then_takes_everything():
    results, rollout = replay_deployment(deployment(**LENIENT), short_trace(), PROFILE)
    actions = [e["action"] for e in rollout.events]
    assert actions[0] == "start" and actions[-1] == "promote"
    steps = [e["weight"] for e in rollout.events if e["action"] == "advance"]
    assert steps == [0.35, 0.45, 0.5]  # CanaryAnalysis's own steps from 0.25 by 0.1 to max 0.5
    assert [w["v2"] for _, w in rollout.schedule] == [0.25, *steps, 1.0]
    promoted_at = rollout.schedule[-1][0]
    v1, v2 = results["chat/v1"], results["chat/v2"]
    assert not np.any(v1.arrival_s >= promoted_at) and np.any(v2.arrival_s >= promoted_at)
    assert v1.summary.requests + v2.summary.requests == len(short_trace())
    # The fixed point: judging the runs again makes the schedule they were run with.
    again, _ = judge(deployment(**LENIENT).gateway_config("k" * 24).models[0].canary, "v2", "v1",
                     {"v1": 1.0, "v2": 0.0}, {"v1": v1, "v2": v2}, short_trace().duration_s)
    assert again == rollout.schedule and rollout.passes >= 2


def test_without_enough_traffic_no_check_decides_and_the_weight_holds():
    _, rollout = replay_deployment(deployment(**LENIENT, min_requests=10**6), short_trace(), PROFILE)
    assert {e["action"] for e in rollout.events} <= {"start", "skip", "inconclusive"}
    assert rollout.schedule == [(0.0, {"v1": 0.75, "v2": 0.25})] and rollout.passes == 1


def test_a_canary_no_worse_than_stable_is_never_rolled_back_at_the_live_defaults():
    """The canary runs the stable version's profile. The old per-window p99 check rolled it
    back here (a scale-from-zero pool's one slow window); the statistical analysis sees
    its latencies are not worse, and keeps collecting until the error margin is proven."""
    _, rollout = replay_deployment(deployment(interval_s=30.0, step_weight=0.1), short_trace(), PROFILE)
    actions = [e["action"] for e in rollout.events]
    assert "rollback" not in actions and "hold" not in actions
    assert rollout.schedule[-1][1]["v2"] >= 0.25
    assert any("pass: TTFT" in e["reason"] for e in rollout.events if e["action"] == "inconclusive")


def test_the_split_follows_the_schedule_segment_by_segment():
    trace = short_trace()
    schedule = [(0.0, {"v1": 0.9, "v2": 0.1}), (400.0, {"v1": 0.2, "v2": 0.8})]
    parts = split_by_schedule(trace, schedule, seed=3)
    early = np.sum(parts["v2"].arrival_s < 400) / np.sum(trace.arrival_s < 400)
    late = np.sum(parts["v2"].arrival_s >= 400) / np.sum(trace.arrival_s >= 400)
    assert 0.05 < early < 0.15 and 0.7 < late < 0.9


def test_rollout_off_holds_the_starting_weights_all_day():
    held = simulate_deployment(deployment(**LENIENT), short_trace(), PROFILE, rollout=False)
    assert 0.2 < held["chat/v2"].summary.requests / len(short_trace()) < 0.3
