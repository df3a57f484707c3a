"""The default policy: provision for the load that will arrive after a cold start.

A new instance takes ``lead_time_s`` (cold start plus a tick) to take traffic, so
this policy sizes the pool for the arrival rate forecast that far ahead (Holt's
linear trend, or yesterday's profile at the same hour once a full day has been
seen), in units of one instance's saturation throughput measured online
(:mod:`llmserve.autoscale.saturation`), plus a square-root staffing margin: with
each request holding a batch seat for its whole generation, a pool is a
many-server queue, and the headroom such a queue needs grows like the square
root of the load, not in proportion to it.

Reactive signals are the safety net for when the forecast is wrong. A gateway
queue means every seat is taken: the pool then needs at least a seat for every
request in it (the backlog floor), whatever is already coming. A queue that keeps
building, or p99 latency over target while batches are full, with nothing on its
way, adds a fraction of the pool at once. Latency alone is not enough: one long
prompt can put a window's p99 over target on an idle pool, and more instances
would not help.

Batch-class work is not demand: the forecast learns realtime arrivals only, the
reactive floors count realtime queues and latency, and the pool grows for a
batch only as far as its completion window needs (:mod:`llmserve.autoscale.batch_need`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmserve.autoscale.batch_need import with_batch_need
from llmserve.autoscale.saturation import CapacityEstimate, update_capacity
from llmserve.autoscale.config import PredictiveConfig, SLOConfig
from llmserve.autoscale.forecast import (
    HoltState,
    SeasonalProfile,
    ewma_update,
    holt_forecast,
    holt_update,
    seasonal_delta,
    seasonal_update,
)
from llmserve.autoscale.policy import Decision
from llmserve.autoscale.signals import PoolSignals


@dataclass(frozen=True, slots=True)
class PredictiveState:
    """Forecaster state, learned daily profile and capacity estimate."""

    holt: HoltState | None
    season: SeasonalProfile | None
    capacity: CapacityEstimate
    recent: tuple[float, float] | None = None  # (arrivals, t): the fast average that decides when to let go


def instances_for(load_tokens_per_s: float, capacity_tokens_per_s: float, target_utilisation: float,
                  margin_z: float) -> int:
    """Square-root staffing: R + z * sqrt(R) instances for an offered load of R.

    R is the load in instance units at ``target_utilisation`` of the measured
    capacity. The margin absorbs the Poisson and length noise around the
    forecast, which grows like the square root of the load, so big pools run
    hotter than small ones.
    """
    r = load_tokens_per_s / (capacity_tokens_per_s * target_utilisation)
    if r < IDLE_LOAD:  # (a forecast decaying toward zero never reaches it: the pool could never go to zero)
        return 0
    return math.ceil(r + margin_z * math.sqrt(r) - 1e-9)


IDLE_LOAD = 0.02  # instance units of forecast load treated as none (~6 tok/s of a 300 tok/s instance)


class PredictivePolicy:
    """Forecast over the lead time, capacity measured online, reactive fallback."""

    def __init__(self, config: PredictiveConfig, slo: SLOConfig) -> None:
        self.config = config
        self.slo = slo

    def initial_state(self) -> PredictiveState:
        cfg = self.config
        season = SeasonalProfile.empty(cfg.season_period_s, cfg.season_bins) if cfg.seasonality else None
        return PredictiveState(None, season, CapacityEstimate(cfg.capacity_tokens_per_s))

    def forecast(self, state: PredictiveState, now: float) -> tuple[float, str]:
        """Demand (tokens/s) to provision for now: max of the level and the lead-time forecast."""
        cfg = self.config
        holt = state.holt
        if holt is None:
            return 0.0, "no history"
        ahead, how = holt_forecast(holt, cfg.lead_time_s), "holt"
        if state.season is not None:
            delta = seasonal_delta(state.season, now, cfg.lead_time_s)
            if delta is not None:
                ahead, how = holt.level + delta, "seasonal"
        return max(holt.level, ahead, 0.0), how

    def decide(self, ctx: PoolSignals, state: PredictiveState) -> Decision:
        cfg = self.config
        y = ctx.realtime_tokens_per_s
        holt = holt_update(state.holt, ctx.now, y, cfg.level_tau_s, cfg.trend_tau_s)
        recent = ewma_update(state.recent, ctx.now, y, cfg.let_go_tau_s)
        let_go = recent[0] < cfg.let_go_ratio * holt.level
        if let_go:
            # Arrivals fell well under the level: the old level and its trend describe
            # load that is gone. Rises never take this path.
            holt = HoltState(recent[0], 0.0, holt.t, holt.updates)
        season = state.season
        if season is not None:
            season = seasonal_update(season, ctx.now, y, cfg.season_tau_periods)
        capacity = update_capacity(state.capacity, ctx, cfg)
        new_state = PredictiveState(holt, season, capacity, recent)

        demand, how = self.forecast(new_state, ctx.now)
        cap = capacity.tokens_per_s
        desired = instances_for(demand, cap, cfg.target_utilisation, cfg.margin_z)
        if ctx.in_flight > 0:
            desired = max(desired, 1)
        reason = (f"{how} forecast {demand:.0f} tok/s in {cfg.lead_time_s:g}s / "
                  f"{cap:.0f} tok/s per instance -> {desired}{' (let go: arrivals fell)' if let_go else ''}")
        need = ctx.batch_need_tokens_per_s
        with_need = with_batch_need(desired, demand, need, cap, cfg.target_utilisation)
        if with_need > desired:
            desired, reason = with_need, f"{reason}; batch windows need {need:.0f} tok/s -> {with_need}"

        if ctx.ready > 0:
            desired, reason = self._fallback(ctx, desired, reason)
        return Decision(desired, new_state, reason)

    def _fallback(self, ctx: PoolSignals, desired: int, reason: str) -> tuple[int, str]:
        """Reactive floor for when the forecast was wrong.

        A queue at the gateway means every batch seat is taken: the pool needs at
        least a seat for every request in it now, whatever is already coming (the
        backlog floor). And when the queue keeps building or p99 latency is over
        target with full batches while nothing is coming, add a fraction at once.
        """
        cfg = self.config
        queued, in_flight = ctx.realtime_queued, ctx.realtime_in_flight  # batch work waits for idle seats
        queue_per_instance = queued / ctx.ready
        over = ctx.latency_over(self.slo.ttft_s, self.slo.e2e_s)
        seats_per_instance = ctx.seats_per_instance
        if queued > 0 and seats_per_instance > 0:
            floor = math.ceil(in_flight / seats_per_instance - 1e-9)
            if floor > desired:
                desired = floor
                reason = f"backlog: {in_flight} requests need {floor} instances of {seats_per_instance:.0f} seats"
        queue_building = queue_per_instance > cfg.max_queue_per_instance
        slow_and_busy = over > 1.0 and ctx.batch_fill * ctx.realtime_share >= cfg.fallback_fill
        if ctx.coming == 0 and (queue_building or slow_and_busy):
            bump = ctx.provisioned + max(1, math.ceil(cfg.fallback_step_fraction * ctx.provisioned))
            if bump > desired:
                desired = bump
                reason = (f"fallback: queue {queue_per_instance:.1f}/instance, p99 {over:.2f}x target "
                          f"at fill {ctx.batch_fill:.2f} -> {desired}")
        return desired, reason
