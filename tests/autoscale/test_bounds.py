from dataclasses import dataclass

from llmserve.autoscale.bounds import BoundedPolicy
from llmserve.autoscale.config import BoundsConfig
from llmserve.autoscale.policy import Decision
from llmserve.autoscale.signals import PoolSignals


@dataclass
class Scripted:
    """An inner policy that wants whatever the script says at each tick."""

    wants: dict[float, int]

    def initial_state(self):
        return 0

    def decide(self, ctx, state):
        return Decision(self.wants.get(ctx.now, 0), state + 1, "scripted")


def drive(wants, bounds, provisioned_at=None, ticks=None):
    """Run ticks 0, 10, 20, ...; provisioned follows the decisions unless given."""
    policy = BoundedPolicy(Scripted(wants), bounds)
    state = policy.initial_state()
    provisioned = bounds.min_instances
    out = []
    for t in ticks or sorted(wants):
        ready = provisioned_at(t) if provisioned_at else provisioned
        d = policy.decide(PoolSignals(now=t, ready=ready), state)
        state = d.state
        provisioned = d.desired
        out.append(d.desired)
    return out, state


def test_min_and_max_are_enforced():
    bounds = BoundsConfig(min_instances=2, max_instances=5, scale_up_cooldown_s=0, scale_down_window_s=0,
                          max_step_up=10, max_step_down=10)
    out, _ = drive({0: 0, 10: 9, 20: 1}, bounds)
    assert out == [2, 5, 2]


def test_inner_state_is_threaded_through():
    _, state = drive({0: 1, 10: 1, 20: 1}, BoundsConfig())
    assert state.inner == 3


def test_scale_up_cooldown_holds_the_second_step():
    bounds = BoundsConfig(min_instances=1, scale_up_cooldown_s=30, max_step_up=100)
    out, _ = drive({0: 3, 10: 6, 20: 6, 30: 6, 40: 6}, bounds)
    assert out == [3, 3, 3, 6, 6]


def test_step_cap_on_scale_up():
    bounds = BoundsConfig(min_instances=1, scale_up_cooldown_s=0, max_step_up=2)
    out, _ = drive({0: 10, 10: 10, 20: 10, 30: 10, 40: 10, 50: 10}, bounds)
    assert out == [3, 5, 7, 9, 10, 10]


def test_scale_down_takes_the_max_over_the_window():
    bounds = BoundsConfig(min_instances=1, scale_up_cooldown_s=0, scale_down_window_s=60,
                          max_step_down=100, max_step_up=100)
    wants = {0: 8, 10: 2, 20: 2, 30: 5, 40: 2, 50: 2, 60: 2, 70: 2, 80: 2, 90: 2, 100: 2}
    out, _ = drive(wants, bounds)
    # Desired is a step function: 8 held over [0, 10), so it is inside the 60 s
    # window until t=70; the 5 held over [30, 40) counts until t=100.
    assert out[:7] == [8] * 7
    assert out[7:10] == [5, 5, 5]
    assert out[10:] == [2]


def test_scale_down_step_cap():
    bounds = BoundsConfig(min_instances=1, scale_down_window_s=0, max_step_down=2)
    out, _ = drive({0: 9, 10: 1, 20: 1, 30: 1, 40: 1, 50: 1}, bounds)
    assert out == [9, 7, 5, 3, 1, 1]


def test_coming_capacity_is_counted():
    """Three instances warming already cover a wish for three: nothing more starts."""
    policy = BoundedPolicy(Scripted({0: 3}), BoundsConfig(scale_up_cooldown_s=0))
    d = policy.decide(PoolSignals(now=0, ready=0, warming=2, starting=1), policy.initial_state())
    assert d.desired == 3


def test_below_min_ignores_cooldown():
    bounds = BoundsConfig(min_instances=2, scale_up_cooldown_s=1000)
    policy = BoundedPolicy(Scripted({0: 4, 10: 4}), bounds)
    s = policy.initial_state()
    d = policy.decide(PoolSignals(now=0, ready=2), s)
    assert d.desired == 4
    # two instances failed: back to the floor at once despite the cooldown
    d = policy.decide(PoolSignals(now=10, ready=0), d.state)
    assert d.desired >= 2
    assert d.reason.startswith("below min_instances (2)")


def test_a_request_queued_at_an_empty_pool_starts_one_whatever_the_policy_says():
    bounds = BoundsConfig(min_instances=0, max_instances=3, scale_up_cooldown_s=1000, scale_down_window_s=0)
    policy = BoundedPolicy(Scripted({}), bounds)  # the inner policy wants 0
    state = policy.initial_state()
    d = policy.decide(PoolSignals(now=0.0), state)
    assert d.desired == 0
    d = policy.decide(PoolSignals(now=1.0, queue_depth={"realtime": 1}), d.state)
    assert d.desired == 1 and "scale from zero" in d.reason
    d = policy.decide(PoolSignals(now=2.0, starting=1, queue_depth={"realtime": 1}), d.state)
    assert d.desired == 1  # one on its way is enough


def test_a_pool_goes_to_zero_only_once_idle():
    bounds = BoundsConfig(min_instances=0, max_instances=3, scale_up_cooldown_s=0, scale_down_window_s=0)
    policy = BoundedPolicy(Scripted({}), bounds)  # the inner policy wants 0 throughout
    d = policy.decide(PoolSignals(now=0.0, ready=1, arrival_rate=0.2), policy.initial_state())
    assert d.desired == 1 and "until idle" in d.reason  # a small share still arrives: no flapping
    d = policy.decide(PoolSignals(now=1.0, ready=1, dispatched=1), d.state)
    assert d.desired == 1
    d = policy.decide(PoolSignals(now=2.0, ready=1), d.state)
    assert d.desired == 0
