"""The counter contract (``store.CounterStore``) in Redis, shared by every replica.

``reserve`` is one Lua script, so its check-then-add is atomic across replicas: two
replicas can never both take the last request of a window. It reads and writes only
the keys it is given (all of one client key's, in one Cluster slot: ``counter_key``),
returns integers, and nothing it reads is executed. ``adjust`` and ``used`` need no
atomicity beyond a single command each and go in one pipelined round trip.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

from llmserve.gateway.tenants.decision import Ask, Kind, Reply

_FIELDS = 7  # ARGV per ask, after ARGV[1] = now

# KEYS[i]: ask i's counter. ARGV: now, then per ask: kind, cost, cap, field, oldest, ttl, member.
# Returns {failed (0: none, else the 1-based ask), used..., then the refusing window's bucket pairs}.
_RESERVE = """
local now = tonumber(ARGV[1])
local used = {}
for i = 1, #KEYS do
  local o = 1 + (i - 1) * 7
  local kind, cost, cap = ARGV[o + 1], tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3])
  local u, bk = 0, {}
  if kind == 'h' then
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
    u = redis.call('ZCARD', KEYS[i])
  else
    local oldest = tonumber(ARGV[o + 5])
    local all = redis.call('HGETALL', KEYS[i])
    for j = 1, #all, 2 do
      if tonumber(all[j]) < oldest then
        redis.call('HDEL', KEYS[i], all[j])
      else
        u = u + tonumber(all[j + 1])
        bk[#bk + 1] = tonumber(all[j])
        bk[#bk + 1] = tonumber(all[j + 1])
      end
    end
  end
  used[i] = u
  if u + cost > cap then
    local out = {i}
    for k = 1, i do out[#out + 1] = used[k] end
    for k = 1, #bk do out[#out + 1] = bk[k] end
    return out
  end
end
for i = 1, #KEYS do
  local o = 1 + (i - 1) * 7
  local ttl = tonumber(ARGV[o + 6])
  if ARGV[o + 1] == 'h' then
    redis.call('ZADD', KEYS[i], now + ttl, ARGV[o + 7])
    redis.call('EXPIRE', KEYS[i], ttl)
  else
    redis.call('HINCRBY', KEYS[i], ARGV[o + 4], ARGV[o + 2])
    if ttl > 0 then redis.call('EXPIRE', KEYS[i], ttl) end
  end
end
local out = {0}
for k = 1, #KEYS do out[#out + 1] = used[k] end
return out
"""


class RedisStore:
    """``CounterStore`` on a connected client (``llmserve.state.redis_conn.connect``);
    its errors (connection, timeout) reach the limiter, which then degrades."""

    def __init__(self, client: Redis) -> None:
        self.client = client
        self._reserve = client.register_script(_RESERVE)

    async def reserve(self, asks: Sequence[Ask], now: float) -> Reply:
        args: list[str | int | float] = [repr(now)]
        for a in asks:
            args += [a.kind.value, a.cost, a.cap, a.field, a.oldest, a.ttl_s, a.member or "-"]
        out = [int(x) for x in await self._reserve(keys=[a.key for a in asks], args=args)]
        failed = out[0] - 1
        count = len(asks) if failed < 0 else failed + 1
        rest = out[1 + count:]
        return Reply(failed, tuple(out[1:1 + count]), tuple(zip(rest[::2], rest[1::2])))

    async def adjust(self, changes: Sequence[tuple[Ask, int]], release: Ask | None) -> None:
        pipe = self.client.pipeline(transaction=False)
        for ask, amount in changes:
            pipe.hincrby(ask.key, str(ask.field), amount)
            if ask.ttl_s > 0:
                pipe.expire(ask.key, ask.ttl_s)
        if release is not None:
            pipe.zrem(release.key, release.member)
        await pipe.execute()

    async def used(self, asks: Sequence[Ask], now: float) -> list[int]:
        pipe = self.client.pipeline(transaction=False)
        for a in asks:
            if a.kind is Kind.HOLD:
                pipe.zcount(a.key, f"({now!r}", "+inf")
            else:
                pipe.hgetall(a.key)
        out = []
        for a, got in zip(asks, await pipe.execute()):
            out.append(int(got) if a.kind is Kind.HOLD else
                       sum(int(v) for f, v in got.items() if int(f) >= a.oldest))
        return out

    async def close(self) -> None:
        await self.client.aclose()
