"""Limits applied around any scaling policy, as a wrapper policy.

Bounds live outside the policies so that every policy gets the same protection
and the policies stay about demand only. The wrapper is itself a
:class:`~llmserve.autoscale.policy.ScalingPolicy`, so the live controller and the
simulator hold one object and cannot apply the limits differently.

Rules, in order:

1. the inner desired count is clamped to [min_instances, max_instances];
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
    history: tuple[tuple[float, int], ...] = ()
    last_scale_up: float | None = None


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
        wanted = min(max(inner.desired, cfg.min_instances), cfg.max_instances)
        history = tuple(h for h in state.history if h[0] > now - cfg.scale_down_window_s)
        history += ((now, wanted),)
        current = ctx.provisioned
        last_up = state.last_scale_up
        reason = inner.reason

        if wanted > current:
            if current < cfg.min_instances:
                desired = wanted  # below the floor (start-up, failures): no cooldown, no cap
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
            stable = max(d for _, d in history)
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
