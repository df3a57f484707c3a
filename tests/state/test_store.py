"""The shared store's versioned JSON documents: compare-and-set in Redis (a real,
password-protected redis-server) and in memory behave alike; nothing but a JSON
object is ever read back; an outage is StoreUnavailable."""

from __future__ import annotations

import asyncio

import pytest

from llmserve.state.redis_conn import connect
from llmserve.state.store import CorruptValue, MemoryStore, RedisStore, StoreUnavailable


async def _compare_and_set(store) -> None:
    assert await store.read("doc") is None
    first = await store.write("doc", {"weight": 0.1}, 0)
    assert first.version == 1 and first.value == {"weight": 0.1}
    assert await store.write("doc", {"weight": 0.9}, 0) is None  # a second "first" writer loses
    second = await store.write("doc", {"weight": 0.2}, 1)
    assert second.version == 2
    assert await store.write("doc", {"weight": 0.3}, 1) is None  # stale version
    got = await store.read("doc")
    assert (got.version, got.value) == (2, {"weight": 0.2})


def test_memory_store_compare_and_set():
    asyncio.run(_compare_and_set(MemoryStore()))


def test_redis_store_compare_and_set(redis_server):
    async def go():
        store = RedisStore(await connect(redis_server.url, timeout_s=10), prefix="t:")
        try:
            await _compare_and_set(store)
        finally:
            await store.close()
    asyncio.run(go())


def test_two_racing_writers_exactly_one_wins(redis_server):
    async def go():
        stores = [RedisStore(await connect(redis_server.url, timeout_s=10)) for _ in range(8)]
        await stores[0].write("doc", {"n": 0}, 0)
        results = await asyncio.gather(*(s.write("doc", {"n": i}, 1) for i, s in enumerate(stores)))
        winners = [r for r in results if r is not None]
        assert len(winners) == 1 and (await stores[0].read("doc")).value == winners[0].value
        for s in stores:
            await s.close()
    asyncio.run(go())


def test_a_value_that_is_not_a_json_object_is_refused(redis_server):
    async def go():
        r = await connect(redis_server.url, timeout_s=10)
        store = RedisStore(r)
        await r.hset("llmserve:doc", mapping={"v": 1, "json": "[1, 2]"})
        with pytest.raises(CorruptValue, match="not an object"):
            await store.read("doc")
        await r.hset("llmserve:doc", mapping={"v": 1, "json": "\x80\x04pickle"})
        with pytest.raises(CorruptValue, match="not JSON"):
            await store.read("doc")
        await store.close()
    asyncio.run(go())


def test_an_outage_is_store_unavailable_and_the_client_reconnects(redis_server):
    async def go():
        store = RedisStore(await connect(redis_server.url, timeout_s=10))
        await store.write("doc", {"a": 1}, 0)
        redis_server.stop()
        with pytest.raises(StoreUnavailable):
            await store.read("doc")
        with pytest.raises(StoreUnavailable):
            await store.write("doc", {"a": 2}, 1)
        redis_server.start()  # no persistence: it comes back empty
        assert await store.read("doc") is None
        assert (await store.write("doc", {"a": 3}, 0)).version == 1
        await store.close()
    asyncio.run(go())
