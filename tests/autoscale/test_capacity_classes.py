"""The capacity class split (pure): base on on-demand, burst on spot, fallbacks drained first."""

from __future__ import annotations

import pytest

from llmserve.autoscale.capacity_classes import (ON_DEMAND, SPOT, CapacityConfig, ClassConfig, Mix, SpotConfig,
                                             plan_mix, replacement_class, spot_available, target_mix)
from llmserve.autoscale.config import AutoscaleConfig
from llmserve.lifecycle import InstanceState as S
from llmserve.autoscale.reconcile import InstanceStatus

SPOTTY = CapacityConfig(spot=SpotConfig(max_instances=None))


def pool(*specs):
    """``("od", S.READY, in_flight)``... -> statuses and their classes."""
    statuses, classes = [], {}
    for n, (cls, state, inflight) in enumerate(specs):
        statuses.append(InstanceStatus(n, state, inflight, float(n)))
        classes[n] = SPOT if cls == "spot" else ON_DEMAND
    return statuses, classes


def test_the_base_stays_on_demand_and_the_burst_goes_to_spot():
    assert target_mix(5, SPOTTY, 1, True, 0) == Mix(1, 4)
    assert target_mix(1, SPOTTY, 2, True, 0) == Mix(1, 0)  # desired under the base: all on-demand
    capped = CapacityConfig(spot=SpotConfig(max_instances=2))
    assert target_mix(5, capped, 1, True, 0) == Mix(3, 2)
    both = CapacityConfig(on_demand=ClassConfig(max_instances=2), spot=SpotConfig(max_instances=2))
    assert target_mix(5, both, 1, True, 0) == Mix(2, 2)


def test_without_spot_everything_is_on_demand():
    assert target_mix(6, CapacityConfig(), 1, True, 0) == Mix(6, 0)
    assert not CapacityConfig().spot_enabled


def test_while_spot_is_refused_new_capacity_is_on_demand_and_held_spot_is_kept():
    assert target_mix(5, SPOTTY, 1, False, 2) == Mix(3, 2)
    statuses, classes = pool(("od", S.READY, 0), ("spot", S.READY, 0), ("spot", S.READY, 0))
    plan = plan_mix(5, statuses, classes, SPOTTY, 1, spot_ok=False)
    assert plan.start == 2 and plan.start_classes == (ON_DEMAND, ON_DEMAND)
    assert plan.drain == [] and plan.cancel == []


def test_scale_up_from_empty_gives_each_start_its_class():
    plan = plan_mix(4, [], {}, SPOTTY, 1, spot_ok=True)
    assert plan.start == 4 and sorted(plan.start_classes) == [ON_DEMAND, SPOT, SPOT, SPOT]


def test_scale_down_drains_on_demand_above_the_base_before_spot():
    # base 1 plus two on-demand fallbacks bought while spot was refused, and two spot
    statuses, classes = pool(("od", S.READY, 0), ("od", S.READY, 3), ("od", S.READY, 1),
                             ("spot", S.READY, 0), ("spot", S.READY, 0))
    plan = plan_mix(3, statuses, classes, SPOTTY, 1, spot_ok=True)
    assert sorted(plan.drain) == [0, 2]  # the two od with the fewest in flight; no spot
    assert all(classes[i] == ON_DEMAND for i in plan.drain)


def test_scale_down_keeps_the_base_and_cancels_starting_spot_first():
    statuses, classes = pool(("od", S.READY, 0), ("spot", S.READY, 0), ("spot", S.READY, 2),
                             ("spot", S.STARTING, 0))
    plan = plan_mix(2, statuses, classes, SPOTTY, 1, spot_ok=True)
    assert plan.cancel == [3] and plan.drain == [1]


def test_scale_down_below_the_base_takes_on_demand_too():
    statuses, classes = pool(("od", S.READY, 0), ("od", S.READY, 0), ("spot", S.READY, 0))
    plan = plan_mix(0, statuses, classes, SPOTTY, 2, spot_ok=True)
    assert sorted(plan.drain) == [0, 1, 2]


def test_scale_up_revives_a_draining_instance_of_either_class_before_starting():
    statuses, classes = pool(("od", S.READY, 0), ("od", S.DRAINING, 2))
    plan = plan_mix(3, statuses, classes, SPOTTY, 1, spot_ok=True)
    assert plan.revive == [1]
    assert plan.start == 1 and plan.start_classes == (SPOT,)


def test_an_equal_count_never_swaps_classes():
    statuses, classes = pool(("od", S.READY, 0), ("od", S.READY, 0), ("od", S.READY, 0))
    assert plan_mix(3, statuses, classes, SPOTTY, 1, spot_ok=True).empty


def test_spot_comes_back_after_the_backoff():
    assert not spot_available([100.0], 150.0, 60.0)
    assert spot_available([100.0], 161.0, 60.0)
    assert spot_available([], 0.0, 60.0)


def test_a_lost_spot_instance_is_replaced_on_spot_unless_spot_is_refused():
    assert replacement_class(SPOT, SPOTTY, True) == SPOT
    assert replacement_class(SPOT, SPOTTY, False) == ON_DEMAND
    assert replacement_class(ON_DEMAND, SPOTTY, True) == ON_DEMAND
    assert replacement_class(SPOT, CapacityConfig(), True) == ON_DEMAND


def test_the_file_keeps_spot_defaults_it_does_not_name_and_refuses_a_spot_base():
    cap = AutoscaleConfig.model_validate({"capacity": {"spot": {"max_instances": 8}}}).capacity
    assert cap.spot.price_per_hour == 0.35 and cap.on_demand.price_per_hour == 1.0 and cap.spot_enabled
    with pytest.raises(ValueError, match="spot.min_instances"):
        AutoscaleConfig.model_validate({"capacity": {"spot": {"min_instances": 1, "max_instances": 4}}})
    with pytest.raises(ValueError, match="price_per_hour"):
        AutoscaleConfig.model_validate({"capacity": {"on_demand": {"price_per_hour": -1}}})
