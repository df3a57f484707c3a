"""Stored responses in Redis (``state.redis_url``), so gateway replicas share them.

The same contract as the SQLite store (``llmserve.api.response_store``): a response
stored through one replica is continued (``previous_response_id``), read or deleted
through any other. A record is one JSON string under its own key, written with one
``SET`` (a reader sees all of it or none) and an expiry of ``max_age_s``; a sorted
set of ids by creation time bounds how many are kept: past the count, the key holding
the most loses its oldest (``evicted_owner``, as on SQLite), from per-key sorted sets.
Nothing read back is executed: JSON only. A store that cannot be reached is a 503
for that request (the client may retry), not a 500 and not a silent miss.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from llmserve.api.errors import APIError
from llmserve.api.response_store import StoredResponse, evicted_owner
from llmserve.state.redis_conn import StoreError, StoreUnreachable, connect, redact

log = logging.getLogger(__name__)

PREFIX = "llmserve:response:"
INDEX = "llmserve:responses"  # sorted set: id -> created_at
OWNER_OF = "llmserve:responses:owner-of"  # hash: id -> owner
OWNED = "llmserve:responses:owned:"  # + owner: sorted set of its ids by created_at
COUNTS = "llmserve:responses:counts"  # sorted set: owner -> how many it holds
T = TypeVar("T")


def _unreachable(url: str, e: Exception) -> APIError:
    log.warning("response store at %s: %s", redact(url), e)
    return APIError(503, "the response store is unreachable; try again", code="store_unavailable",
                    headers={"retry-after": "1"})


class RedisResponseStore:
    """A gateway service: ``start`` authenticates once (a wrong password stops the gateway
    with one line; an unreachable Redis does not: requests are a 503 until it answers),
    ``stop`` closes the client."""

    def __init__(self, url: str, password_file: Path | None = None, *, max_age_s: float = 30 * 24 * 3600,
                 max_records: int = 100_000) -> None:
        self.url, self.password_file = url, password_file
        self.max_age_s, self.max_records = max_age_s, max_records
        self._redis: aioredis.Redis | None = None

    async def start(self) -> None:
        try:
            await self._connect()
        except StoreUnreachable as e:  # no refusal: requests answer 503 and try again until it answers
            log.warning("response store: %s", e)

    async def _connect(self) -> aioredis.Redis:
        if self._redis is None:
            self._redis = await connect(self.url, self.password_file)
        return self._redis

    async def stop(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    async def _do(self, op: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
        """``op`` on the client, tried once more on a broken connection (every op here is
        idempotent, and after a Redis restart the pool's first connection is a dead one)."""
        for attempt in (0, 1):
            try:  # connects here when the gateway started with Redis away
                return await op(await self._connect())
            except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError, StoreError) as e:
                if attempt:
                    raise _unreachable(self.url, e) from None
        raise AssertionError("unreachable")

    async def put(self, record: StoredResponse) -> None:
        value = json.dumps({"id": record.id, "owner": record.owner, "response": record.response,
                            "messages": record.messages, "created_at": record.created_at})

        async def op(r: aioredis.Redis) -> None:
            async with r.pipeline(transaction=True) as p:
                p.set(PREFIX + record.id, value, ex=max(int(self.max_age_s), 1))
                p.zadd(INDEX, {record.id: record.created_at})
                p.hset(OWNER_OF, record.id, record.owner)
                p.zadd(OWNED + record.owner, {record.id: record.created_at})  # (in the transaction: an
                *_, added = await p.execute()                                # id is in no index alone)
            if added:  # (not a rewrite)
                await r.zincrby(COUNTS, 1, record.owner)
            for rid in await r.zrangebyscore(INDEX, "-inf", record.created_at - self.max_age_s):
                await _forget(r, rid)  # expired: Redis dropped the record, the indexes follow
            while await r.zcard(INDEX) > self.max_records:
                counts = {o: int(n) for o, n in await r.zrange(COUNTS, 0, -1, withscores=True) if n > 0}
                oldest = await r.zrange(OWNED + evicted_owner(counts), 0, 0) if counts else []
                victim = oldest or await r.zrange(INDEX, 0, 0)  # (ids stored before the per-key sets)
                if not victim:
                    break
                await _forget(r, victim[0])
        await self._do(op)

    async def get(self, response_id: str) -> StoredResponse | None:
        raw = await self._do(lambda r: r.get(PREFIX + response_id))
        if raw is None:
            return None
        d = json.loads(raw)
        return StoredResponse(d["id"], d["owner"], d["response"], d["messages"], d["created_at"])

    async def delete(self, response_id: str) -> bool:
        return await self._do(lambda r: _forget(r, response_id))


async def _forget(r: aioredis.Redis, response_id: str) -> bool:
    """Drop a record and its place in every index; whether the record was there."""
    owner = await r.hget(OWNER_OF, response_id)
    async with r.pipeline(transaction=True) as p:
        p.delete(PREFIX + response_id)
        p.zrem(INDEX, response_id)
        p.hdel(OWNER_OF, response_id)
        if owner is not None:
            p.zrem(OWNED + owner, response_id)
        gone, *rest = await p.execute()
    if owner is not None and rest[-1]:  # (removed from its owner's set by this call: counted down once)
        await r.zincrby(COUNTS, -1, owner)
    return gone > 0
