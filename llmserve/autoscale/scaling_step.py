"""One scaling step, purely: signals -> bounded policy -> override -> plan.

The live controller (:class:`~llmserve.autoscale.controller.PoolController`) and
the simulator (:class:`~llmserve.sim.simulator.Simulator`) both call
:func:`scaling_step` at every tick and only execute its plan their own way
(processes through a provider, or simulated instances). So the simulator makes
the live decisions by construction, not by keeping a copy in step: the policy
with its bounds, a manual override and its expiry, the restart back-off that
holds starts while replacements keep failing, and which instances to start,
revive, cancel or drain (:func:`~llmserve.autoscale.reconcile.plan_scaling`, or
:func:`~llmserve.autoscale.capacity_classes.plan_mix` by capacity class).

Instances on their way out (``stopping``) are the caller's to leave out of
``instances``: they are neither capacity nor candidates for an action.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from llmserve.autoscale.policy import ScalingPolicy
from llmserve.autoscale.reconcile import InstanceStatus, ScalePlan, plan_scaling
from llmserve.autoscale.signals import PoolSignals

# Which instances to act on for a desired count: plan_scaling, or capacity_classes.plan_mix
# (bound to the pool's classes) where spot is on.
Planner = Callable[[int, Sequence[InstanceStatus]], ScalePlan]


@dataclass(frozen=True, slots=True)
class Override:
    """A manual instance count in force until ``until`` (monotonic; None: until cleared)."""

    instances: int
    until: float | None
    reason: str
    set_wall: float

    def in_force(self, now: float) -> bool:
        return self.until is None or now < self.until


@dataclass(frozen=True, slots=True)
class ScalingStep:
    """One tick's decision and the actions that carry it out."""

    provisioned: int  # ready + coming when the step was taken
    desired: int  # what the pool is brought to: the override's count, else the policy's
    policy_desired: int  # what the bounded policy wanted (also under an override)
    reason: str
    source: str  # "policy" or "manual"
    state: Any  # the policy's state for the next tick
    plan: ScalePlan
    held_starts: int = 0  # starts the restart back-off held back this tick

    @property
    def changes(self) -> bool:
        return self.desired != self.provisioned


def scaling_step(policy: ScalingPolicy, state: Any, ctx: PoolSignals, instances: Sequence[InstanceStatus],
                 override: Override | None = None, start_not_before: float = 0.0,
                 planner: Planner = plan_scaling) -> ScalingStep:
    """Decide at ``ctx.now`` and plan the actions.

    The policy runs even under an override, so its state keeps learning and the
    record shows what it would have done. ``start_not_before`` is the restart
    back-off: starts planned before it are held (the next tick plans them again).
    """
    now = ctx.now
    decision = policy.decide(ctx, state)
    desired, reason, source = decision.desired, decision.reason, "policy"
    if override is not None and override.in_force(now):
        desired, source = override.instances, "manual"
        reason = f"manual override to {desired} ({override.reason}); policy wanted {decision.desired}"
    plan = planner(desired, instances)
    held = 0
    if plan.start and now < start_not_before:
        held = plan.start
        plan = replace(plan, start=0, start_classes=())
    return ScalingStep(ctx.provisioned, desired, decision.desired, reason, source, decision.state, plan, held)
