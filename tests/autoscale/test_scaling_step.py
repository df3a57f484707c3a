"""The one scaling step: policy, override and its expiry, restart back-off, plan."""

from llmserve.autoscale import AutoscaleConfig, BoundsConfig, PoolSignals, StaticConfig, build_policy
from llmserve.lifecycle import InstanceState as S
from llmserve.autoscale.reconcile import InstanceStatus, ScalePlan
from llmserve.autoscale.scaling_step import Override, scaling_step

POLICY = build_policy(AutoscaleConfig(policy="threshold", bounds=BoundsConfig(
    min_instances=3, max_instances=8, scale_up_cooldown_s=0.0, scale_down_window_s=0.0)))
ONE_READY = [InstanceStatus("a", S.READY, 2, 0.0)]


def ctx(now: float = 10.0) -> PoolSignals:
    return PoolSignals(now=now, ready=1, busy_fraction=0.5)


def test_the_policy_decides_and_the_plan_carries_it_out():
    step = scaling_step(POLICY, POLICY.initial_state(), ctx(), ONE_READY)
    assert (step.provisioned, step.desired, step.policy_desired, step.source) == (1, 3, 3, "policy")
    assert step.changes and step.plan.start == 2 and step.held_starts == 0
    assert "min_instances" in step.reason
    assert step.state != POLICY.initial_state()  # the bounds' history moved on


def test_an_override_in_force_wins_and_the_policy_still_learns():
    o = Override(1, until=20.0, reason="maintenance", set_wall=0.0)
    step = scaling_step(POLICY, POLICY.initial_state(), ctx(10.0), ONE_READY, o)
    assert (step.desired, step.policy_desired, step.source) == (1, 3, "manual")
    assert not step.changes and step.plan.empty
    assert "policy wanted 3" in step.reason
    expired = scaling_step(POLICY, POLICY.initial_state(), ctx(20.0), ONE_READY, o)
    assert (expired.desired, expired.source) == (3, "policy")


def test_the_restart_backoff_holds_starts_but_not_the_rest_of_the_plan():
    statuses = ONE_READY + [InstanceStatus("d", S.DRAINING, 1, 5.0)]
    step = scaling_step(POLICY, POLICY.initial_state(), ctx(10.0), statuses, start_not_before=12.0)
    assert step.plan.revive == ["d"] and step.plan.start == 0 and step.held_starts == 1
    later = scaling_step(POLICY, POLICY.initial_state(), ctx(12.0), statuses, start_not_before=12.0)
    assert later.plan.start == 1 and later.held_starts == 0


def test_a_static_pool_is_brought_to_its_count():
    policy = build_policy(AutoscaleConfig(policy="static", static=StaticConfig(instances=1)))
    statuses = ONE_READY + [InstanceStatus("b", S.READY, 0, 1.0), InstanceStatus("c", S.STARTING, 0, 9.0)]
    step = scaling_step(policy, policy.initial_state(), PoolSignals(now=10.0, ready=2, starting=1), statuses)
    assert step.desired == 1 and step.plan.cancel == ["c"] and step.plan.drain == ["b"]


def test_the_planner_is_the_callers_and_held_starts_take_their_classes_along():
    def by_class(desired, instances):  # what capacity_classes.plan_mix returns for a spot burst
        return ScalePlan(start=desired - len(instances), start_classes=("spot",) * (desired - len(instances)))

    step = scaling_step(POLICY, POLICY.initial_state(), ctx(), ONE_READY, planner=by_class)
    assert step.plan.start_classes == ("spot", "spot")
    held = scaling_step(POLICY, POLICY.initial_state(), ctx(), ONE_READY, start_not_before=11.0, planner=by_class)
    assert held.plan.start == 0 and held.plan.start_classes == () and held.held_starts == 2
