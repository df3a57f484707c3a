"""The counter contract (store.CounterStore), the same on both stores: in memory and a
real Redis (its Lua script). Atomic across clients: concurrent replicas never take
more than the cap between them."""

from __future__ import annotations

import asyncio

import pytest

from llmserve.gateway.tenants.config import Budget, KeyLimits, Period, Prices
from llmserve.gateway.tenants.decision import Limit, admission_asks, token_asks
from llmserve.gateway.tenants.redis_store import RedisStore
from llmserve.gateway.tenants.store import MemoryStore
from llmserve.state.redis_conn import connect

FREE = Prices()
NOW = 1_000_000.0


@pytest.fixture(params=["memory", "redis"])
async def store(request):
    if request.param == "memory":
        yield MemoryStore()
        return
    server = request.getfixturevalue("redis_server")
    s = RedisStore(await connect(server.url, timeout_s=10))
    yield s
    await s.close()


async def test_reserve_adds_every_cost_or_none(store):
    limits = KeyLimits(requests=5, tokens=100)
    asks = admission_asks("k", limits, FREE, 30, 30, NOW, "r1", 60)
    r = await store.reserve(asks, NOW)
    assert r.failed == -1 and r.used == (0, 0)
    r = await store.reserve(asks, NOW + 1)
    assert r.failed == 1 and r.used == (1, 60)  # the tokens refuse: 60 + 60 > 100
    assert await store.used(asks, NOW + 1) == [1, 60]  # and the request was not counted either
    assert r.buckets and sum(a for _, a in r.buckets) == 60


async def test_old_buckets_stop_counting(store):
    limits = KeyLimits(requests=1, window_s=10.0)
    asks = admission_asks("k", limits, FREE, 0, 0, NOW, "r", 60)
    assert (await store.reserve(asks, NOW)).failed == -1
    assert (await store.reserve(admission_asks("k", limits, FREE, 0, 0, NOW + 10.5, "r", 60), NOW + 10.5)).failed == 0
    later = admission_asks("k", limits, FREE, 0, 0, NOW + 11.0, "r", 60)  # a bucket past one window on
    assert (await store.reserve(later, NOW + 11.0)).failed == -1


async def test_adjust_gives_back_without_a_cap(store):
    limits = KeyLimits(tokens=100)
    asks = token_asks("k", limits, FREE, 50, 50, NOW)
    assert (await store.reserve(asks, NOW)).failed == -1
    await store.adjust([(asks[0], -80)], None)
    assert await store.used(asks, NOW) == [20]
    await store.adjust([(asks[0], 500)], None)  # settling may go past the cap
    assert await store.used(asks, NOW) == [520]


async def test_holds_are_released_or_lapse(store):
    limits = KeyLimits(max_concurrent=2)
    a = admission_asks("k", limits, FREE, 0, 0, NOW, "a", 30)
    b = admission_asks("k", limits, FREE, 0, 0, NOW, "b", 30)
    c = admission_asks("k", limits, FREE, 0, 0, NOW, "c", 30)
    assert (await store.reserve(a, NOW)).failed == -1
    assert (await store.reserve(b, NOW)).failed == -1
    assert (await store.reserve(c, NOW)).failed == 0
    await store.adjust([], a[0])
    assert (await store.reserve(c, NOW)).failed == -1
    assert await store.used(c, NOW) == [2]
    assert await store.used(c, NOW + 31) == [0]  # a dead replica's holds lapse


async def test_a_budget_counts_per_period(store):
    limits = KeyLimits(budget=Budget(tokens=100, period=Period.DAY))
    asks = token_asks("k", limits, FREE, 60, 0, NOW)
    assert (await store.reserve(asks, NOW)).failed == -1
    assert (await store.reserve(asks, NOW)).failed == 0
    tomorrow = NOW + 86400
    assert (await store.reserve(token_asks("k", limits, FREE, 60, 0, tomorrow), tomorrow)).failed == -1


async def test_concurrent_clients_never_take_more_than_the_cap(redis_server):
    """Eight clients (as eight replicas) race for a cap of 25: exactly 25 win."""
    clients = [RedisStore(await connect(redis_server.url, timeout_s=10)) for _ in range(8)]
    limits = KeyLimits(requests=25, window_s=60.0)

    async def one(s: RedisStore, i: int) -> bool:
        asks = admission_asks("shared", limits, FREE, 0, 0, NOW, f"r{i}", 60)
        return (await s.reserve(asks, NOW)).failed < 0

    wins = await asyncio.gather(*(one(clients[i % 8], i) for i in range(200)))
    assert sum(wins) == 25
    assert await clients[0].used(admission_asks("shared", limits, FREE, 0, 0, NOW, "x", 60)[:1], NOW) == [25]
    for s in clients:
        await s.close()


async def test_the_keys_of_one_client_key_share_a_cluster_slot():
    asks = admission_asks("team-a", KeyLimits(requests=1, tokens=9, max_concurrent=1,
                                              budget=Budget(tokens=9)), FREE, 0, 0, NOW, "r", 60)
    assert {a.key.split("{")[1].split("}")[0] for a in asks} == {"team-a"}
    assert len({a.key for a in asks}) == 4 and {a.limit for a in asks} == set(Limit)
