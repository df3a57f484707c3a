"""The simulator replays a ``models:`` deployment: the gateway's router splits the
trace by the starting weights, and each pool runs with its own autoscale config."""

from __future__ import annotations

import pytest

from llmserve.serve.serve_config import ServeConfig
from llmserve.sim.deployment import simulate_deployment, split_trace, starting_weights

from .test_simulator import short_trace, small_profile


def deployment(**canary) -> ServeConfig:
    return ServeConfig.model_validate({
        "autoscale": {"policy": "kpa", "tick_s": 2.0, "bounds": {"min_instances": 1, "max_instances": 6}},
        "models": [{"name": "chat", "versions": [
            {"name": "v1", "model": "/m/a"},
            {"name": "v2", "model": "/m/b", "autoscale": {"bounds": {"min_instances": 0, "max_instances": 6}}}],
            "canary": {"version": "v2", "stable": "v1", "start_weight": 0.25, **canary}}]})


def test_the_canary_starts_at_its_start_weight_unless_started_by_hand():
    assert starting_weights(deployment(), "chat") == pytest.approx({"v1": 0.75, "v2": 0.25})
    assert starting_weights(deployment(auto_start=False), "chat") == {"v1": 1.0, "v2": 0.0}


def test_split_follows_the_weights_and_keeps_every_request_once():
    trace = short_trace()
    parts = split_trace(trace, {"v1": 0.75, "v2": 0.25}, seed=1)
    assert len(parts["v1"]) + len(parts["v2"]) == len(trace)
    assert 0.2 < len(parts["v2"]) / len(trace) < 0.3


def test_each_pool_is_sized_from_its_own_share():
    results = simulate_deployment(deployment(), short_trace(), small_profile(cold_start_s=5.0), rollout=False)
    assert list(results) == ["chat/v1", "chat/v2"]
    v1, v2 = results["chat/v1"].summary, results["chat/v2"].summary
    assert v1.requests > 2 * v2.requests
    assert v1.instance_hours > v2.instance_hours  # three times the traffic, more capacity
    assert v1.completed == v1.requests and v2.completed == v2.requests
