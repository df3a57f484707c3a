"""A pool whose instances keep failing before they get ready gives up (Ray Serve's
DEPLOY_FAILED): the pure rule, then the controller over a fake provider and a real
gateway Pool: no more starts, requests fail at once naming the reason, an operator's
retry starts again, and a ready instance ends a run of failures."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from llmserve.autoscale.metrics import AutoscaleMetrics

from llmserve.autoscale.managed import ControllerConfig
from llmserve.autoscale.start_failures import gives_up
from llmserve.gateway.balancer import RouteRequest
from llmserve.gateway.pool import NoHealthyInstance
from llmserve.priority import PriorityClass

from .fakes import make_controller
from .test_controller import step


def test_the_rule_gives_up_after_the_limit_in_a_row_and_never_while_one_serves_or_at_zero():
    assert not gives_up(2, 3, 0) and gives_up(3, 3, 0) and gives_up(4, 3, 0)
    assert not gives_up(3, 3, 1)  # one serving: the pool can run, keep backing off
    assert not gives_up(100, 0, 0)  # 0: retry forever


def test_the_limit_is_validated():
    assert ControllerConfig().max_start_failures == 3
    for bad in (-1, 1.5, "x"):
        with pytest.raises(ValidationError):
            ControllerConfig(max_start_failures=bad)


async def fail_current(ctl, provider, clock) -> None:
    for iid in list(ctl.instances):
        provider.engines[iid].state = "failed"
    await step(ctl, clock)


async def run_to_give_up(ctl, provider, clock, limit: int) -> None:
    await step(ctl, clock)
    for _ in range(limit):
        assert len(ctl.instances) == 1
        await fail_current(ctl, provider, clock)
        await step(ctl, clock, 1.5)  # the back-off (1 s, doubling, capped at 1 s) passes


async def test_a_pool_gives_up_then_fails_requests_at_once_until_retried(caplog):
    ctl, provider, pool, clock = make_controller(restart_backoff_s=1.0, max_restart_backoff_s=1.0,
                                                 max_start_failures=3)
    registry = CollectorRegistry()
    ctl.metrics = AutoscaleMetrics(registry)
    ctl.metrics.attach(ctl)

    def failed_gauge() -> float | None:
        return registry.get_sample_value("llmserve:autoscale_pool_failed", {"model": "m", "version": "v1"})

    assert failed_gauge() == 0.0
    queued = asyncio.ensure_future(pool.acquire(RouteRequest(), PriorityClass.REALTIME))
    with caplog.at_level("INFO", logger="llmserve.autoscale"):
        await run_to_give_up(ctl, provider, clock, 3)
        for _ in range(5):
            await step(ctl, clock, 5.0)
    assert ctl.instances == {} and len(provider.specs) == 3  # no fourth start
    lines = [r.getMessage() for r in caplog.records]
    said = [i for i, m in enumerate(lines) if "failed: 3 instances in a row" in m]
    assert len(said) == 1 and "engine failed to start: boom" in lines[said[0]]
    assert "/admin/autoscale/retry?pool=m/v1" in lines[said[0]]
    assert lines[said[0] + 1:] == []  # said once: the ticks after it say nothing more
    row = ctl.describe()["failed"]
    assert row["failures"] == 3 and "engine failed to start: boom" in row["last_failure"]
    with pytest.raises(NoHealthyInstance, match="boom"):  # the one that waited failed with the reason
        await asyncio.wait_for(queued, 1)
    with pytest.raises(NoHealthyInstance, match="instances in a row failed before getting ready"):
        pool.enqueue(RouteRequest(), PriorityClass.REALTIME)  # a new one: at once, not after a timeout
    assert any(e["kind"] == "pool_failed" for e in ctl.history.events())
    assert failed_gauge() == 1.0  # what an alert fires on
    with pytest.raises(NoHealthyInstance) as refused:
        pool.enqueue(RouteRequest(), PriorityClass.REALTIME)
    assert refused.value.code == "pool_failed"  # the client's error code: not a breaker's

    assert ctl.retry() and not ctl.retry()
    await step(ctl, clock)
    assert len(ctl.instances) == 1 and ctl.describe()["failed"] is None and pool.failed is None
    assert failed_gauge() == 0.0
    [iid] = ctl.instances
    provider.engines[iid].state = "ready"
    await step(ctl, clock)
    lease = await asyncio.wait_for(pool.acquire(RouteRequest(), PriorityClass.REALTIME), 1)
    assert lease.instance.instance_id == iid


async def test_a_ready_instance_resets_the_count_and_zero_never_gives_up():
    ctl, provider, pool, clock = make_controller(restart_backoff_s=1.0, max_restart_backoff_s=1.0,
                                                 max_start_failures=3)
    await run_to_give_up(ctl, provider, clock, 2)
    [iid] = ctl.instances
    provider.engines[iid].state = "ready"
    await step(ctl, clock)
    assert ctl.executor.failures_before_ready == 0
    provider.engines[iid].state = "failed"  # dies once ready: a replacement, not a start failure
    await step(ctl, clock)
    await run_to_give_up(ctl, provider, clock, 2)
    assert ctl.executor.gave_up is None and len(ctl.instances) == 1

    ctl, provider, pool, clock = make_controller(restart_backoff_s=1.0, max_restart_backoff_s=1.0,
                                                 max_start_failures=0)
    await run_to_give_up(ctl, provider, clock, 6)
    assert ctl.executor.gave_up is None and len(ctl.instances) == 1 and pool.failed is None
