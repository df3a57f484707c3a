"""The classic reactive policy: utilisation thresholds, queue depth and latency.

It is the baseline the other policies are measured against. It only reacts to
what has already happened, so with a cold start of minutes it is late by
construction; that lateness is what the simulator makes visible.
"""

from __future__ import annotations

import math

from llmserve.autoscale.batch_need import observed_capacity, with_batch_need
from llmserve.autoscale.config import SLOConfig, ThresholdConfig
from llmserve.autoscale.policy import Decision
from llmserve.autoscale.signals import PoolSignals


class ThresholdPolicy:
    """Scale proportionally when utilisation leaves the [down, up] band.

    Above ``scale_up_utilisation`` or below ``scale_down_utilisation`` the desired
    count is ``ceil(ready * utilisation / target)`` (what Kubernetes' HPA does);
    inside the band the pool stays as it is. A gateway queue longer than
    ``max_queue_per_instance`` per ready instance, or a TTFT/e2e p99 over the SLO
    while utilisation is at least the target (an idle pool with one slow long
    prompt does not need more instances), adds ``latency_step`` instances, but
    only when nothing is already starting or warming: capacity on its way counts,
    or every tick of a cold start would add another instance. Stateless.

    Batch-class work counts only as far as a completion window needs it: the
    utilisation is the realtime share of it, the queue the realtime queue, and
    the pool grows for a batch by :func:`~llmserve.autoscale.batch_need.with_batch_need`.
    """

    def __init__(self, config: ThresholdConfig, slo: SLOConfig) -> None:
        self.config = config
        self.slo = slo

    def initial_state(self) -> None:
        return None

    def decide(self, ctx: PoolSignals, state: None) -> Decision:
        cfg = self.config
        current = ctx.provisioned
        if ctx.ready == 0:
            if current == 0 and (ctx.in_flight > 0 or ctx.arrival_rate > 0):
                return Decision(1, None, "demand and no instance")
            return Decision(current, None, "no ready instance yet")

        util = ctx.utilisation(cfg.metric) * ctx.realtime_share
        queued = ctx.realtime_queued
        desired, reason = current, f"{cfg.metric} utilisation {util:.2f} within band"
        if util > cfg.scale_up_utilisation or util < cfg.scale_down_utilisation:
            desired = math.ceil(ctx.ready * util / cfg.target_utilisation - 1e-9)
            reason = f"{cfg.metric} utilisation {util:.2f} -> {desired} at target {cfg.target_utilisation:.2f}"
            if desired < current and (queued > 0 or ctx.latency_over(self.slo.ttft_s, self.slo.e2e_s) > 1):
                desired, reason = current, f"low {cfg.metric} utilisation but queue or latency high: hold"

        if ctx.coming == 0:
            queue_per_instance = queued / ctx.ready
            over = ctx.latency_over(self.slo.ttft_s, self.slo.e2e_s)
            if queue_per_instance > cfg.max_queue_per_instance and desired < current + cfg.latency_step:
                desired = current + cfg.latency_step
                reason = f"gateway queue {queue_per_instance:.1f}/instance > {cfg.max_queue_per_instance}"
            elif over > 1.0 and util >= cfg.target_utilisation and desired < current + cfg.latency_step:
                desired = current + cfg.latency_step
                reason = f"p99 latency {over:.2f}x over target"
        need = ctx.batch_need_tokens_per_s
        with_need = with_batch_need(desired, ctx.realtime_tokens_per_s, need, observed_capacity(ctx),
                                    cfg.target_utilisation)
        if with_need > desired:
            desired, reason = with_need, f"{reason}; batch windows need {need:.0f} tok/s -> {with_need}"
        return Decision(max(desired, 0), None, reason)
