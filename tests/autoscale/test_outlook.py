"""The forecast realtime load the batch share follows: the predictive policy's own, in instances."""

from __future__ import annotations

import pytest

from llmserve.autoscale.build import build_policy
from llmserve.autoscale.config import AutoscaleConfig
from llmserve.autoscale.outlook import realtime_load
from llmserve.autoscale.signals import PoolSignals


def decided(policy: str, tokens_per_s: float, ticks: int = 5):
    p = build_policy(AutoscaleConfig(policy=policy))
    state = p.initial_state()
    for i in range(ticks):
        ctx = PoolSignals(now=15.0 * (i + 1), ready=2, arrival_rate=1.0, arrival_tokens_per_s=tokens_per_s)
        state = p.decide(ctx, state).state
    return p, state


def test_the_predictive_forecast_in_instances_of_its_capacity():
    p, state = decided("predictive", 300.0)
    inner = state.inner
    demand, _ = p.inner.forecast(inner, 75.0)
    assert demand == pytest.approx(300.0, rel=0.01)
    assert realtime_load(p, state, 75.0) == pytest.approx(demand / inner.capacity.tokens_per_s)
    _, busier = decided("predictive", 900.0)
    assert realtime_load(p, busier, 75.0) == pytest.approx(3 * realtime_load(p, state, 75.0), rel=0.01)


def test_no_forecast_no_load():
    p = build_policy(AutoscaleConfig(policy="predictive"))
    assert realtime_load(p, p.initial_state(), 0.0) is None  # nothing observed yet
    t, state = decided("threshold", 300.0)
    assert realtime_load(t, state, 75.0) is None
