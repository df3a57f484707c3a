"""The stored-responses contract on SQLite and on a real Redis: whole records, a bounded
size, a reopen (a restarted gateway, or another replica), and an outage as a 503."""

from __future__ import annotations

import pytest

from llmserve.api.errors import APIError
from llmserve.api.response_store import SQLiteResponseStore, StoredResponse
from llmserve.state.redis_conn import StoreError
from llmserve.state.response_store import RedisResponseStore


def _rec(i: int, owner: str = "o", created: float | None = None) -> StoredResponse:
    return StoredResponse(f"resp_{i}", owner, {"id": f"resp_{i}", "output": [i], "text": "é ✓"},
                          [{"role": "user", "content": str(i)}], float(i) if created is None else created)


@pytest.fixture(params=["sqlite", "redis"])
def opener(request, tmp_path):
    """A function that opens the store (again: a second call is a restarted gateway or
    another replica reading the same state)."""
    if request.param == "sqlite":
        return lambda **kw: SQLiteResponseStore(tmp_path / "r.db", **kw)
    server = request.getfixturevalue("redis_server")
    return lambda **kw: RedisResponseStore(server.url, **kw)


async def test_put_get_delete_and_a_reopen(opener):
    s = opener(max_age_s=1e12)  # the records are dated 1970
    await s.put(_rec(1))
    assert await s.get("resp_1") == _rec(1)
    assert await opener(max_age_s=1e12).get("resp_1") == _rec(1)
    assert await s.delete("resp_1") and not await s.delete("resp_1") and await s.get("resp_1") is None
    assert await opener(max_age_s=1e12).get("resp_1") is None


async def test_the_oldest_go_past_the_cap(opener):
    s = opener(max_records=3, max_age_s=1e12)
    for i in range(1, 6):
        await s.put(_rec(i))
    assert [await s.get(f"resp_{i}") is not None for i in range(1, 6)] == [False, False, True, True, True]


async def test_one_keys_flood_evicts_its_own_oldest_never_another_keys(opener):
    s = opener(max_records=4, max_age_s=1e12)
    await s.put(_rec(1, owner="quiet"))  # the oldest of all
    await s.put(_rec(2, owner="other"))
    for i in range(3, 12):
        await s.put(_rec(i, owner="flood"))
    kept = [i for i in range(1, 12) if await s.get(f"resp_{i}") is not None]
    assert kept == [1, 2, 10, 11]
    assert await s.delete("resp_11")  # a deleted one frees its place: the next put evicts nobody
    await s.put(_rec(12, owner="other"))
    assert [i for i in range(1, 13) if await s.get(f"resp_{i}") is not None] == [1, 2, 10, 12]
    await s.put(_rec(13, owner="quiet"))  # quiet and other hold 2 each, flood 1: of a tie, the first name
    assert [i for i in range(1, 14) if await s.get(f"resp_{i}") is not None] == [1, 10, 12, 13]


async def test_redis_records_expire_and_are_json(redis_server):
    import redis

    s = RedisResponseStore(redis_server.url, max_age_s=3600)
    await s.put(_rec(7, created=1e9))
    raw = redis.Redis.from_url(redis_server.url, decode_responses=True)
    assert 0 < raw.ttl("llmserve:response:resp_7") <= 3600  # Redis drops it after max_age_s
    assert raw.get("llmserve:response:resp_7").startswith('{"id": "resp_7"')  # JSON, never pickle
    await s.stop()


async def test_redis_outage_is_a_503_and_recovers(redis_server):
    s = RedisResponseStore(redis_server.url, max_age_s=1e12)
    await s.start()
    await s.put(_rec(1))
    redis_server.stop()
    for call in (s.get("resp_1"), s.put(_rec(2)), s.delete("resp_1")):
        with pytest.raises(APIError) as e:
            await call
        assert e.value.status == 503 and e.value.code == "store_unavailable"
    redis_server.start()  # the same port, empty (no persistence in the tests' server)
    await s.put(_rec(3))
    assert await s.get("resp_3") == _rec(3)


async def test_a_wrong_password_refuses_to_start(redis_server):
    bad = redis_server.url.replace(redis_server.password, "not-the-password")
    with pytest.raises(StoreError, match="refused our credentials"):
        await RedisResponseStore(bad).start()
    with pytest.raises(APIError) as e:  # and a request through it is a 503, not a 500
        await RedisResponseStore(bad).get("resp_1")
    assert e.value.status == 503


async def test_a_gateway_started_with_redis_away_serves_once_it_is_back(redis_server):
    redis_server.stop()
    s = RedisResponseStore(redis_server.url, max_age_s=1e12)
    await s.start()  # no refusal: an unreachable store degrades
    with pytest.raises(APIError) as e:
        await s.get("resp_1")
    assert e.value.status == 503
    redis_server.start()
    await s.put(_rec(1))
    assert await s.get("resp_1") == _rec(1)


def _open_at_once(path: str, barrier, errors) -> None:
    from llmserve.api.response_store import connect

    barrier.wait()
    try:
        connect(path).close()
    except Exception as e:  # noqa: BLE001 - reported to the test
        errors.put(repr(e))


def test_processes_opening_a_new_store_at_once_all_get_it(tmp_path):
    """Gateway replicas on one state folder open its files together; switching a new file
    into WAL can fail at once with "database is locked" (no busy wait): each one retries."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    errors = ctx.Queue()
    for i in range(40):
        barrier = ctx.Barrier(4)
        procs = [ctx.Process(target=_open_at_once, args=(str(tmp_path / f"s{i}.db"), barrier, errors))
                 for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert found == []


def test_a_refused_switch_into_wal_is_tried_again(tmp_path, monkeypatch):
    import sqlite3

    from llmserve.api import response_store

    real = sqlite3.connect
    refusals = [2]

    class Refusing:
        def __init__(self, db):
            self.db = db

        def execute(self, sql, *a):
            if sql == "PRAGMA journal_mode=WAL" and refusals[0]:
                refusals[0] -= 1
                raise sqlite3.OperationalError("database is locked")
            return self.db.execute(sql, *a)

        def close(self):
            self.db.close()

    monkeypatch.setattr(response_store.sqlite3, "connect", lambda *a, **k: Refusing(real(*a, **k)))
    db = response_store.connect(tmp_path / "r.db")
    assert refusals == [0]
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
