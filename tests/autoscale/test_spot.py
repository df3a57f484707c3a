"""The controller with spot capacity, against the fake provider and a fake clock.

Starts carry their class to the provider; refused or slow spot falls back to
on-demand; a reclaim notice drains the instance at once and starts its
replacement in the same step (not at the next tick); cost is counted by class.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from llmserve.autoscale.capacity_actions import NoReclaim

from llmserve.autoscale.capacity_classes import CapacityConfig, SpotConfig
from llmserve.lifecycle import InstanceState as S
from llmserve.autoscale.metrics import AutoscaleMetrics
from llmserve.gateway.balancer import RouteRequest
from llmserve.gateway.pool import Outcome
from llmserve.priority import PriorityClass

from .fakes import make_controller
from .test_controller import ready_pool, states, step

REQ = RouteRequest()
SPOT = CapacityConfig(spot=SpotConfig(max_instances=4), spot_start_timeout_s=10.0, spot_backoff_s=60.0)


def classes(ctl) -> dict[str, str]:
    return {i.id: i.capacity_class for i in ctl.instances.values()}


def spot_pool(static: int = 3, **kw):
    return make_controller(min_instances=1, max_instances=6, static=static, capacity=SPOT, **kw)


async def test_the_base_starts_on_demand_and_the_rest_on_spot_and_the_provider_is_told():
    ctl, provider, pool, clock = spot_pool()
    await step(ctl, clock)
    assert sorted(classes(ctl).values()) == ["on_demand", "spot", "spot"]
    assert {s.instance_id: s.capacity_class for s in provider.specs} == classes(ctl)
    views = {v["instance_id"]: v["capacity_class"] for v in ctl.instance_views()}
    assert views == classes(ctl)
    assert ctl.describe()["class_counts"] == {"on_demand": 1, "spot": 2}


async def test_refused_spot_starts_on_demand_and_later_starts_do_not_ask_for_spot():
    ctl, provider, pool, clock = spot_pool(initial_state="ready")
    provider.refuse_spot = True
    await step(ctl, clock)
    assert sorted(classes(ctl).values()) == ["on_demand"] * 3
    assert len(provider.engines) == 3  # every instance started, none failed
    fallbacks = [e for e in ctl.history.events() if e["kind"] == "spot_fallback"]
    assert len(fallbacks) == 2
    assert not ctl.spot_ok(clock())
    provider.refuse_spot = False  # within the backoff: still on-demand
    ctl.set_override(4, None, "more")
    await step(ctl, clock)
    assert list(classes(ctl).values()).count("on_demand") == 4
    clock.t += 61.0  # the backoff is over
    ctl.set_override(5, None, "more again")
    await step(ctl, clock)
    assert list(classes(ctl).values()).count("spot") == 1


async def test_a_spot_instance_slow_to_start_is_replaced_on_demand():
    ctl, provider, pool, clock = spot_pool(static=2)
    await step(ctl, clock)
    slow = next(i for i, c in classes(ctl).items() if c == "spot")
    for _ in range(11):
        await step(ctl, clock)
    assert slow not in ctl.instances  # cancelled
    assert sorted(classes(ctl).values()) == ["on_demand", "on_demand"]
    replacement = next(i for i in ctl.instances.values() if i.replaces == slow)
    assert replacement.capacity_class == "on_demand"


async def test_a_reclaim_notice_drains_at_once_and_the_replacement_starts_in_the_same_step():
    ctl, provider, pool, clock = spot_pool(static=2)
    await ready_pool(ctl, provider, clock)
    spot_id = next(i for i, c in classes(ctl).items() if c == "spot")
    ctl._next_tick = clock() + 1000.0  # no tick in this test: only the notice may start the replacement
    a = await pool.acquire(REQ, PriorityClass.REALTIME)
    b = await pool.acquire(REQ, PriorityClass.REALTIME)  # least-loaded: one on each instance
    lease = a if a.instance.instance_id == spot_id else b
    assert lease.instance.instance_id == spot_id
    provider.engines[spot_id].reclaim_at = clock() + 30.0
    await step(ctl, clock)
    assert states(ctl)[spot_id] == "draining"
    assert not pool.get(spot_id).accepting
    new = next(i for i in ctl.instances.values() if i.replaces == spot_id)
    assert new.capacity_class == "spot" and new.state is S.STARTING
    assert provider.stops == []  # a request is still in flight on it
    provider.engines[new.id].state = "ready"
    await step(ctl, clock)
    await step(ctl, clock)
    assert states(ctl)[new.id] == "ready"
    pool.release(lease, Outcome.SUCCESS)
    await step(ctl, clock)
    assert spot_id not in ctl.instances and provider.stops == [spot_id]
    assert provider.engines[spot_id].sigterm_with_running == 0
    assert len(ctl.instances) == 2  # one replacement, no second one


async def test_a_reclaimed_instance_killed_at_its_deadline_is_not_replaced_twice_nor_revived():
    ctl, provider, pool, clock = spot_pool(static=2)
    await ready_pool(ctl, provider, clock)
    spot_id = next(i for i, c in classes(ctl).items() if c == "spot")
    provider.engines[spot_id].running = 1  # the engine still reports work: the drain waits
    provider.engines[spot_id].reclaim_at = clock() + 5.0
    await step(ctl, clock)
    ctl.set_override(3, None, "scale up while it drains")
    await step(ctl, clock)
    assert states(ctl)[spot_id] == "draining"  # never revived
    provider.engines[spot_id].exit_code = -9  # the deadline: the provider takes it
    await step(ctl, clock)
    assert spot_id not in ctl.instances
    assert ctl.provisioned() == 3 and len(ctl.instances) == 3


async def test_cost_is_counted_by_class_at_each_price():
    registry = CollectorRegistry()
    ctl, provider, pool, clock = spot_pool(static=3, initial_state="ready")
    ctl.metrics = AutoscaleMetrics(registry)
    ctl.metrics.attach(ctl)
    await step(ctl, clock)  # billing starts
    for _ in range(36):
        await step(ctl, clock, dt=100.0)  # one hour
    assert abs(ctl.cost_dollars["on_demand"] - 1.0) < 0.03
    assert abs(ctl.cost_dollars["spot"] - 2 * 0.35) < 0.03
    got = registry.get_sample_value("llmserve:autoscale_instance_cost_dollars_total",
                                    {"model": "m", "version": "v1", "capacity_class": "spot"})
    assert abs(got - ctl.cost_dollars["spot"]) < 1e-9
    assert registry.get_sample_value("llmserve:autoscale_class_instances",
                                     {"model": "m", "version": "v1", "capacity_class": "spot"}) == 2


async def test_a_provider_without_reclaim_refuses_the_admin_reclaim():
    ctl, provider, pool, clock = spot_pool(static=1, initial_state="ready")
    await step(ctl, clock)
    with pytest.raises(NoReclaim, match="cannot simulate reclaims"):
        await ctl.reclaim("v1-1", 5.0)
    with pytest.raises(NoReclaim, match="no started instance"):
        await ctl.reclaim("v1-9", 5.0)
    assert ctl.instances["v1-1"].reclaim_at is None
