"""The realtime load a policy expects over its lead time, in instances: what the batch share follows.

Pure. The predictive policy sizes its pool for the forecast realtime demand over
the lead time; the batch runner sizes its share of seats from the same forecast
(:mod:`llmserve.gateway.batches.share`), so the two never disagree about when the
load climbs. The live controller and the simulator both call :func:`realtime_load`
after each tick. A policy without a forecast (threshold, kpa, static) gives None.
"""

from __future__ import annotations

from typing import Any

from llmserve.autoscale.bounds import BoundedPolicy, BoundedState
from llmserve.autoscale.predictive import PredictivePolicy, PredictiveState


def realtime_load(policy: Any, state: Any, now: float) -> float | None:
    """The forecast realtime demand over the lead time, in instances of the measured
    saturation throughput; None without a forecast."""
    while isinstance(policy, BoundedPolicy) and isinstance(state, BoundedState):
        policy, state = policy.inner, state.inner
    if not isinstance(policy, PredictivePolicy) or not isinstance(state, PredictiveState) or state.holt is None:
        return None
    demand, _ = policy.forecast(state, now)
    cap = state.capacity.tokens_per_s
    return demand / cap if cap > 0 else None
