"""Online estimate of one instance's throughput at the latency SLO.

The predictive policy turns a forecast in tokens per second into instances by
dividing by what one instance can serve while still meeting the SLO. That number
depends on the model, the hardware and the request mix, so it is measured, not
configured: the configured value is only a prior.

Each tick brackets it with what was observed:

- latency within the SLO at throughput X proves the capacity is at least X;
- latency over the SLO at throughput X says it is at most X: the estimate moves
  down towards X with time constant ``capacity_tau_s`` (an EWMA, so one bad tick
  does not halve the pool);
- when instances run close to the estimate and latency is comfortably low
  (p99 under ``capacity_low_water`` of the target), the estimate is probed upward
  slowly, never beyond ``capacity_probe_ceiling`` times what was observed, so a
  too-cautious prior does not cost instance-hours forever.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmserve.autoscale.config import PredictiveConfig, SLOConfig
from llmserve.autoscale.signals import PoolSignals


@dataclass(frozen=True, slots=True)
class CapacityEstimate:
    """Tokens per second one ready instance serves within the SLO, as of time ``t``."""

    tokens_per_s: float
    t: float | None = None
    violations: int = 0


def update_capacity(est: CapacityEstimate, ctx: PoolSignals, cfg: PredictiveConfig,
                    slo: SLOConfig) -> CapacityEstimate:
    """Fold one tick's throughput and latency into the estimate."""
    if est.t is None or ctx.now <= est.t:
        return CapacityEstimate(est.tokens_per_s, ctx.now, est.violations)
    dt = ctx.now - est.t
    observed = ctx.throughput_per_instance
    if ctx.ready == 0 or observed <= 0 or ctx.ttft_p99 is None:
        return CapacityEstimate(est.tokens_per_s, ctx.now, est.violations)

    cap = est.tokens_per_s
    over = ctx.latency_over(slo.ttft_s, slo.e2e_s)
    if over > 1.0:
        if observed < cap:
            cap += (observed - cap) * (1.0 - math.exp(-dt / cfg.capacity_tau_s))
        return CapacityEstimate(cap, ctx.now, est.violations + 1)

    cap = max(cap, observed)
    if over < cfg.capacity_low_water and observed >= cfg.capacity_low_water * cap:
        probed = min(cap * (1.0 + cfg.capacity_probe_per_s * dt), observed * cfg.capacity_probe_ceiling)
        cap = max(cap, probed)
    return CapacityEstimate(cap, ctx.now, est.violations)
