"""Limits applied around any scaling policy, as a wrapper policy.

Bounds live outside the policies so that every policy gets the same protection
and the policies stay about demand only. The wrapper is itself a
:class:`~llmserve.autoscale.policy.ScalingPolicy`, so the live controller and the
simulator hold one object and cannot apply the limits differently.

Rules, in order:

1. the inner desired count is clamped to [min_instances, max_instances]; and a
   pool goes to zero only once idle: while anything is queued or in flight, or a
   request arrived within the signal window, it keeps (or gets) at least one,
   whatever the policy said. So a queued request is demand that starts one from
   zero, and a pool on a small traffic share does not flap between 0 and 1;
2. it is compared with the provisioned count (ready + starting + warming):
   instances on their way are capacity already decided, not a reason to add more;
3. scale-up: at most ``max_step_up`` at once, and not within
   ``scale_up_cooldown_s`` of the previous scale-up;
4. scale-down: to the *maximum* desired count seen over the last
   ``scale_down_window_s`` (so a short dip does not drain what the next minute
   needs again), at most ``max_step_down`` at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmserve.autoscale.config import BoundsConfig
from llmserve.autoscale.policy import Decision, ScalingPolicy
from llmserve.autoscale.signals import PoolSignals


@dataclass(frozen=True, slots=True)
class BoundedState:
    """The inner policy's state plus the wrapper's own history."""

    inner: Any
    history: tuple[tuple[float, int], ...] = ()  # (since, desired), one entry per change
    last_scale_up: float | None = None


def _record(history: tuple[tuple[float, int], ...], now: float, wanted: int,
            window: float) -> tuple[tuple[float, int], ...]:
    """Append ``wanted`` and forget what the window no longer covers.

    History is run-length encoded (an entry only when the count changes), so a
    steady pool keeps a one-entry history however short the tick. An entry older
    than the window still counts while it is the latest one before the window:
    its value held into the window.
    """
    if history[-1][1] != wanted:
        history += ((now, wanted),)
    start = now - window
    keep = 0
    while keep + 1 < len(history) and history[keep + 1][0] <= start:
        keep += 1
    return history[keep:]


class BoundedPolicy:
    """Wraps ``inner`` with min/max, cooldown, stabilisation and step caps."""

    def __init__(self, inner: ScalingPolicy, config: BoundsConfig) -> None:
        self.inner = inner
        self.config = config

    def initial_state(self) -> BoundedState:
        return BoundedState(self.inner.initial_state())

    def decide(self, ctx: PoolSignals, state: BoundedState) -> Decision:
        cfg = self.config
        now = ctx.now
        inner = self.inner.decide(ctx, state.inner)
        current = ctx.provisioned
        active = ctx.in_flight > 0 or ctx.arrival_rate > 0
        floor = max(cfg.min_instances, 1 if active else 0)
        wanted = min(max(inner.desired, floor), cfg.max_instances)
        reason = inner.reason
        if inner.desired < floor > cfg.min_instances:
            reason = (f"scale from zero: {ctx.queued} queued; {inner.reason}" if current == 0
                      else f"kept 1 until idle; {inner.reason}")
        history = _record(state.history or ((now, current),), now, wanted, cfg.scale_down_window_s)
        last_up = state.last_scale_up

        if wanted > current:
            if current < cfg.min_instances:
                desired = wanted  # below the floor (start-up, failures): no cooldown, no cap
                reason = f"below min_instances ({cfg.min_instances}); {inner.reason}"
            elif current < floor:
                desired = wanted  # from zero: a request waits, so no cooldown
            elif last_up is not None and now - last_up < cfg.scale_up_cooldown_s:
                desired = current
                reason = f"{inner.reason}; held by scale-up cooldown"
            else:
                desired = min(wanted, current + cfg.max_step_up)
                if desired < wanted:
                    reason = f"{inner.reason}; step capped at +{cfg.max_step_up}"
            if desired > current:
                last_up = now
        else:
            stable = max(d for _, d in history)  # the runs overlapping the window
            if stable < current:
                desired = max(stable, current - cfg.max_step_down)
                if stable > wanted:
                    reason = f"{inner.reason}; stabilised at {stable} (max over {cfg.scale_down_window_s:g}s)"
            else:
                desired = current
                if wanted < current:
                    reason = f"{inner.reason}; held by scale-down window"
        desired = min(max(desired, cfg.min_instances), cfg.max_instances)
        return Decision(desired, BoundedState(inner.state, history, last_up), reason)
