"""Knative-style concurrency autoscaling with a stable and a panic window.

Knative's KPA is the best-known request-driven autoscaler; reproducing its logic
(stable window 60 s, panic window 6 s, panic when the panic-window desired count
reaches twice the ready count, never scale down while panicking) gives the
simulator an honest second baseline beside the threshold policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmserve.autoscale.batch_need import observed_capacity, with_batch_need
from llmserve.autoscale.config import KPAConfig
from llmserve.autoscale.policy import Decision
from llmserve.autoscale.signals import PoolSignals


@dataclass(frozen=True, slots=True)
class KPAState:
    """Concurrency samples inside the stable window and the panic bookkeeping."""

    samples: tuple[tuple[float, float], ...] = ()
    panic_since: float | None = None
    max_panic_desired: int = 0


def _window_mean(samples: tuple[tuple[float, float], ...], now: float, window: float) -> float:
    vals = [c for t, c in samples if t > now - window]
    return sum(vals) / len(vals) if vals else 0.0


class KPAPolicy:
    """Desired = ceil(mean concurrency / target per instance), over two windows.

    Concurrency is every request in the pool: queued at the gateway plus waiting
    and running in the engines. The stable window decides in calm times. When the
    panic window alone asks for ``panic_threshold`` times the ready count, the
    policy panics: it follows the panic window, never goes below the highest
    count it asked for during the panic, and leaves panic only once a whole
    stable window has passed without the threshold being crossed.

    Batch-class requests are left out of the concurrency; the pool grows for a
    batch only as far as its completion window needs
    (:func:`~llmserve.autoscale.batch_need.with_batch_need`).
    """

    def __init__(self, config: KPAConfig) -> None:
        self.config = config

    def initial_state(self) -> KPAState:
        return KPAState()

    def target(self, ctx: PoolSignals) -> float:
        """Concurrency one instance should carry: configured, or a share of its seats."""
        cfg = self.config
        if cfg.target_concurrency is not None:
            return cfg.target_concurrency
        seats = ctx.seats_per_instance or cfg.default_seats
        return max(cfg.target_utilisation * seats, 1e-3)

    def decide(self, ctx: PoolSignals, state: KPAState) -> Decision:
        cfg = self.config
        now = ctx.now
        target = self.target(ctx)
        samples = tuple((t, c) for t, c in state.samples if t > now - cfg.stable_window_s)
        samples += ((now, float(ctx.realtime_in_flight)),)
        stable = _window_mean(samples, now, cfg.stable_window_s)
        panic = _window_mean(samples, now, cfg.panic_window_s)

        ready = max(ctx.ready, 1)
        up_limit = math.ceil(cfg.max_scale_up_rate * ready)
        down_limit = math.floor(ready / cfg.max_scale_down_rate)
        want_stable = min(max(math.ceil(stable / target - 1e-9), down_limit), up_limit)
        want_panic = min(max(math.ceil(panic / target - 1e-9), down_limit), up_limit)
        over = want_panic / ready >= cfg.panic_threshold

        panic_since, max_panic = state.panic_since, state.max_panic_desired
        if over:
            panic_since = now
        elif panic_since is not None and now > panic_since + cfg.stable_window_s:
            panic_since, max_panic = None, 0

        desired = want_stable
        reason = f"stable concurrency {stable:.1f} / target {target:g}"
        if panic_since is not None:
            desired = max(desired, want_panic, max_panic)
            max_panic = desired
            reason = f"panic: concurrency {panic:.1f} over {cfg.panic_window_s:g}s; no scale-down"
        need = ctx.batch_need_tokens_per_s
        with_need = with_batch_need(desired, ctx.realtime_tokens_per_s, need, observed_capacity(ctx),
                                    cfg.target_utilisation)
        if with_need > desired:
            desired, reason = with_need, f"{reason}; batch windows need {need:.0f} tok/s -> {with_need}"
        if ctx.in_flight == 0 and ctx.arrival_rate == 0 and desired == 0:
            reason = "idle"
        return Decision(max(desired, 0), KPAState(samples, panic_since, max_panic), reason)
