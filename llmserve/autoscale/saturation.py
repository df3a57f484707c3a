"""Online estimate of what one instance can serve: its saturation throughput.

The predictive policy turns a forecast in tokens per second into instances by
dividing by the throughput one instance sustains within the latency SLO. It
plans each instance at ``target_utilisation`` of its *saturation* throughput
(tokens/s with every batch seat taken), and this module measures that
saturation throughput online; the configured value is only a prior.

Why saturation and not "throughput while latency is fine": per-instance
throughput falls when the pool grows, so an estimator that lowers its number
whenever p99 latency is over target (a long prompt alone can do that) and
reads the per-instance throughput at that moment spirals: more instances,
lower throughput each, lower estimate, more instances. Saturation throughput
does not depend on the pool size, and it is observable exactly when it
matters: when work waits at the gateway because every instance is full.

- saturated tick (gateway queue non-empty, batches nearly full): the observed
  per-instance throughput *is* the saturation throughput;
- nearly full batches without a queue (fill >= ``capacity_measure_fill``):
  throughput divided by fill is a close estimate (a slight overestimate: per-seat
  throughput falls a little as the last seats fill);
- anything lighter says little and is ignored: a lightly loaded instance's
  throughput is a lower bound, but a noisy one (a window holding a few prompt
  prefills runs far above the mean), and scaling it up by 1/fill over-reads
  the batching gain, so estimates built on it drift past the truth.

Measurements move the estimate with time constant ``capacity_tau_s`` (an EWMA,
either direction), so one odd window does not resize the pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmserve.autoscale.config import PredictiveConfig
from llmserve.autoscale.signals import PoolSignals

SATURATED_FILL = 0.9


@dataclass(frozen=True, slots=True)
class CapacityEstimate:
    """Saturation throughput (tokens/s) of one ready instance, as of time ``t``."""

    tokens_per_s: float
    t: float | None = None
    saturated_ticks: int = 0


def update_capacity(est: CapacityEstimate, ctx: PoolSignals, cfg: PredictiveConfig) -> CapacityEstimate:
    """Fold one tick's throughput, batch fill and queue into the estimate."""
    if est.t is None or ctx.now <= est.t:
        return CapacityEstimate(est.tokens_per_s, ctx.now, est.saturated_ticks)
    dt = ctx.now - est.t
    observed = ctx.throughput_per_instance
    if ctx.ready == 0 or observed <= 0:
        return CapacityEstimate(est.tokens_per_s, ctx.now, est.saturated_ticks)

    fill = ctx.batch_fill
    if ctx.queued > 0 and fill >= SATURATED_FILL:
        measured, saturated = observed, est.saturated_ticks + 1
    elif fill >= cfg.capacity_measure_fill:
        measured, saturated = observed / fill, est.saturated_ticks
    else:
        return CapacityEstimate(est.tokens_per_s, ctx.now, est.saturated_ticks)
    cap = est.tokens_per_s
    cap += (measured - cap) * (1.0 - math.exp(-dt / cfg.capacity_tau_s))
    return CapacityEstimate(cap, ctx.now, saturated)
