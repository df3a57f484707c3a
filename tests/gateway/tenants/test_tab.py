"""A request's account against a real limiter (in-memory counters): reserved at
admission, charged as a stream runs, settled to the actual usage once."""

from __future__ import annotations

import asyncio
import json

import pytest

from llmserve.api.errors import APIError
from llmserve.gateway.batches.config import StateConfig
from llmserve.gateway.metrics import GatewayMetrics
from llmserve.gateway.tenants.config import Budget, KeyLimits, Period, Prices
from llmserve.gateway.tenants.limiter import Tenants
from llmserve.gateway.tenants.tab import first_events

BODY = {"max_tokens": 10}


def tenants(limits: KeyLimits, prices: Prices | None = None) -> Tenants:
    return Tenants({"k": limits, "free": None}, {"m": prices or Prices()}, StateConfig(), 600.0,
                   GatewayMetrics(lambda: []))


async def settled(t: Tenants) -> dict:
    await asyncio.sleep(0)  # the settlement runs in the background
    await asyncio.gather(*t._tasks)
    return (await t.report("k"))["limits"]


async def test_settling_replaces_the_estimate_with_the_actual_usage():
    t = tenants(KeyLimits(tokens=10_000, budget=Budget(amount=1.0, period=Period.DAY), max_concurrent=1),
                Prices(prompt=1.0, completion=2.0))
    tab = await t.admit("k", "m", BODY, 90, False, "r1")
    before = (await t.report("k"))["limits"]
    assert before["tokens"]["used"] == 90 // 3 + 8 + 10  # the estimate, reserved
    assert before["concurrent"]["used"] == 1
    tab.close(12, 7, served=True)
    tab.close(99, 99, served=True)  # once only
    after = await settled(t)
    assert after["tokens"]["used"] == 19
    assert after["budget"]["used"] == pytest.approx((12 * 1.0 + 7 * 2.0) / 1000)
    assert after["concurrent"]["used"] == 0
    assert t.usage.total("k")["completion_tokens"] == 7


async def test_a_request_that_was_never_served_costs_nothing():
    t = tenants(KeyLimits(tokens=10_000, requests=5))
    tab = await t.admit("k", "m", BODY, 30, False, "r1")
    tab.close(None, 0, served=False)
    after = await settled(t)
    assert after["tokens"]["used"] == 0 and after["requests"]["used"] == 1  # the request still counts


async def test_a_stream_reserves_batch_by_batch_and_is_cut_by_its_budget():
    t = tenants(KeyLimits(budget=Budget(tokens=50, period=Period.DAY), stream_charge_tokens=10))
    tab = await t.admit("k", "m", {"max_tokens": 1000}, 0, True, "r1")
    # the first batch, and no slack for closing chunks: an event past it may be a token
    assert (tab.prompt, tab.completion, tab.next_at) == (8, 10, 10)
    assert await tab.charge(11) is None  # 11 sent: those and 10 more reserved
    assert tab.completion == 21 and tab.next_at == 21
    assert await tab.charge(22) is None
    assert tab.completion == 32
    cut = await tab.charge(33)  # 8 + 32 reserved: 11 more do not fit in 50
    assert cut is not None and tab.room(30) == 2
    error, done = cut.split(b"\n\n")[:2]
    body = json.loads(error[len(b"data: "):])["error"]
    assert body["code"] == "insufficient_quota" and "stopped after 32 tokens" in body["message"]
    assert done == b"data: [DONE]"
    tab.close(None, 32, served=True)
    assert (await settled(t))["budget"]["used"] == 8 + 32  # never past the budget


async def test_a_stream_its_budget_covers_reserves_it_whole_and_is_not_charged_on_the_way():
    t = tenants(KeyLimits(budget=Budget(tokens=5000, period=Period.DAY), stream_charge_tokens=10))
    tab = await t.admit("k", "m", {"max_tokens": 100}, 0, True, "r1")
    assert (tab.completion, tab.next_at) == (100, 102)  # one script call for the whole stream
    assert (await t.report("k"))["limits"]["budget"]["used"] == 108


async def test_refusals_are_429s_with_retry_after_and_unlimited_keys_pass():
    t = tenants(KeyLimits(requests=1, window_s=10))
    await t.admit("k", "m", BODY, 0, False, "r1")
    with pytest.raises(APIError) as e:
        await t.admit("k", "m", BODY, 0, False, "r2")
    assert e.value.status == 429 and 1 <= int(e.value.headers["retry-after"]) <= 11
    assert await t.admit(None, "m", BODY, 0, False, "r3") is None
    free = await t.admit("free", "m", BODY, 0, False, "r4")
    assert free is not None and free.next_at > 10**9  # counted, never charged mid-stream


def test_first_events_keeps_whole_events():
    events = b"data: a\n\ndata: b\n\ndata: c\n\n"
    assert first_events(events, 0) == b""
    assert first_events(events, 2) == b"data: a\n\ndata: b\n\n"
    assert first_events(events, 9) == events


async def test_with_redis_gone_a_replica_enforces_its_share_of_what_was_left(redis_server):
    limits = KeyLimits(requests=30, window_s=60, budget=Budget(tokens=300, period=Period.DAY))
    t = Tenants({"k": limits}, {}, StateConfig(redis_url=redis_server.url, replicas=3), 600.0,
                GatewayMetrics(lambda: []), probe_s=0.05)
    await t.start()
    try:
        (await t.admit("k", "m", BODY, 0, False, "r0")).close(8, 10, served=True)  # 18 of 300, in Redis
        assert t.status() == {"store": "redis", "degraded": False, "replicas": 3}
        redis_server.stop()
        admitted = 0
        with pytest.raises(APIError) as e:
            for i in range(20):
                (await t.admit("k", "m", BODY, 0, False, f"r{i + 1}")).close(8, 10, served=True)
                admitted += 1
        assert admitted == (300 - 18) // 3 // 18  # the share of what Redis said was left
        assert e.value.code == "insufficient_quota"
        assert t.status()["degraded"] and t.status()["local_share"] == "1/3"
        redis_server.start()
        for _ in range(100):
            if not t.status()["degraded"]:
                break
            await asyncio.sleep(0.05)
        assert not t.status()["degraded"]
        await t.admit("k", "m", BODY, 0, False, "back")
        assert (await t.report("k"))["counted_by"] == "every replica (redis)"
    finally:
        await t.stop()
