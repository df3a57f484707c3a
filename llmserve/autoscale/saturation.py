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

- saturated tick (realtime work queued at the gateway, batches nearly full): the
  observed per-instance throughput *is* the saturation throughput (batch-class
  lines queue whenever they wait for idle seats, so their queue does not count);
- nearly full batches without a queue (fill >= ``capacity_measure_fill``):
  throughput divided by fill is a close estimate (a slight overestimate: per-seat
  throughput falls a little as the last seats fill);
- at any other fill, an llmserve instance's own step model says it: every
  instance fits ``base + prompt tokens x per-token + rows x per-row`` to its
  own steps (from the warm-up's small batch on, at any batch size, with the
  threads it really has), and :func:`modelled_capacity` turns that into the
  tokens/s of a full batch of the pool's mean request. The first such model
  replaces the configured prior outright: no constant outlives the first
  instance that can be measured;
- anything lighter, from an upstream without a step model (llama.cpp, vLLM),
  says little and is ignored: a lightly loaded instance's throughput is a
  lower bound, but a noisy one (a window holding a few prompt prefills runs
  far above the mean), and scaling it up by 1/fill over-reads the batching
  gain, so estimates built on it drift past the truth.

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
    measured: bool = False  # a step model has replaced the prior


def modelled_capacity(base_s: float, prefill_token_s: float, decode_seq_s: float, seats: int,
                      mean_prompt_tokens: float, mean_output_tokens: float) -> float:
    """Tokens/s (prompt + output) of one instance with all ``seats`` taken by requests of
    the mean shape: each costs its prompt's prefill plus, for each output token, a row
    and its share of the step's fixed part."""
    if seats <= 0 or mean_output_tokens <= 0:
        return 0.0
    per_request_s = (mean_prompt_tokens * prefill_token_s
                     + mean_output_tokens * (decode_seq_s + base_s / seats))
    return (mean_prompt_tokens + mean_output_tokens) / per_request_s if per_request_s > 0 else 0.0


def update_capacity(est: CapacityEstimate, ctx: PoolSignals, cfg: PredictiveConfig) -> CapacityEstimate:
    """Fold one tick's throughput, batch fill, queue and step models into the estimate."""
    if est.t is None or ctx.now <= est.t:
        return CapacityEstimate(est.tokens_per_s, ctx.now, est.saturated_ticks, est.measured)
    dt = ctx.now - est.t
    observed = ctx.throughput_per_instance
    fill = ctx.batch_fill
    saturated = est.saturated_ticks
    # realtime work waiting: a batch queue says nothing, batch lines wait for idle seats by design;
    # nor does a realtime queue while batch lines hold seats (the seats are taken, the instances
    # are not at their throughput: read so, the estimate fell ~8 % for the rest of the day)
    if (ctx.ready > 0 and observed > 0 and ctx.realtime_queued > 0 and fill >= SATURATED_FILL
            and ctx.batch_dispatched == 0):
        measured, saturated = observed, saturated + 1
    elif ctx.ready > 0 and ctx.modelled_capacity > 0 and cfg.capacity_from_model:
        if not est.measured:  # the first instance's own model replaces the configured prior
            return CapacityEstimate(ctx.modelled_capacity, ctx.now, saturated, True)
        measured = ctx.modelled_capacity
    elif ctx.ready > 0 and observed > 0 and fill >= cfg.capacity_measure_fill:
        measured = observed / fill
    else:
        return CapacityEstimate(est.tokens_per_s, ctx.now, saturated, est.measured)
    cap = est.tokens_per_s
    cap += (measured - cap) * (1.0 - math.exp(-dt / cfg.capacity_tau_s))
    return CapacityEstimate(cap, ctx.now, saturated, est.measured)
