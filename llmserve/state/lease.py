"""One writer per pool: a lease in Redis and the fencing token that comes with it.

A replica that wants to scale a pool takes its lease: ``SET NX PX`` of
``holder:token``, where ``token`` is an ``INCR`` of the pool's counter taken at
acquisition (one Lua script, so no two holders ever share a token). The holder
renews it every ``renew_s`` with a compare-and-extend script; a holder that
stops renewing (killed, paused, cut off from Redis) loses it after ``ttl_s``
and another replica takes it with a larger token.

The token is what makes a late action harmless: every provider action carries it
and is refused unless the lease still holds ``holder:token``
(:meth:`Lease.valid`, used by :mod:`llmserve.autoscale.providers.fenced`), so a
leader paused past its lease and resumed cannot start or stop anything, whatever
its own loop believes. Writes the followers read (the pool's view) go through
:meth:`Lease.fenced_set`, checked in the same script.

Replicas also mark themselves present (:meth:`Lease.present`): a leader shutting
down leaves the instances to the others when any is alive, and stops them when
it is the last one out.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator
from redis import exceptions as redis_errors

log = logging.getLogger(__name__)

STORE_ERRORS = (redis_errors.RedisError, OSError)

# KEYS: lease, counter. ARGV: holder, ttl_ms. The new token, or nil while another holds it.
_ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return nil end
local t = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. t, 'NX', 'PX', ARGV[2])
return t
"""
# KEYS: lease. ARGV: value, ttl_ms. 1 when extended, 0 when the lease is no longer ours.
_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# KEYS: lease, target. ARGV: value, payload. A write only the current holder can make.
_FENCED_SET = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
return 1
"""


class LeaseConfig(BaseModel):
    """``ttl_s``: how long a silent leader keeps its pool (scaling pauses at most this
    plus one tick on failover); renewed every ``ttl_s / 3``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ttl_s: float = Field(6.0, gt=0.0, le=10.0)
    renew_s: float | None = Field(None, gt=0.0)  # None: ttl_s / 3

    @model_validator(mode="after")
    def _checked(self) -> LeaseConfig:
        if self.renew_s is not None and self.renew_s >= self.ttl_s:
            raise ValueError(f"leases: renew_s ({self.renew_s}) must be shorter than ttl_s ({self.ttl_s})")
        return self

    @property
    def renew_every_s(self) -> float:
        return self.renew_s if self.renew_s is not None else self.ttl_s / 3


def holder_id() -> str:
    """This process's name in leases: host, pid and a random part (a pid can be reused)."""
    return f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"


@dataclass
class Held:
    """What :meth:`Lease.hold` found: the token while we hold it (None: another holds
    it, or the store could not be asked) and whether that token is new."""

    token: int | None
    new: bool = False
    error: str | None = None


class Lease:
    """The lease of one named resource (a pool), for one holder."""

    def __init__(self, redis, name: str, config: LeaseConfig | None = None, holder: str | None = None,
                 clock=time.monotonic) -> None:
        self.redis = redis
        self.name = name
        self.config = config or LeaseConfig()
        self.holder = holder or holder_id()
        self.key = f"llmserve:lease:{name}"
        self.counter_key = f"llmserve:lease:{name}:token"
        self.presence_key = f"llmserve:replicas:{name}"
        self.clock = clock
        self.token: int | None = None
        self.valid_until = 0.0  # monotonic: past it we no longer count ourselves the holder
        self._acquire = redis.register_script(_ACQUIRE)
        self._extend = redis.register_script(_EXTEND)
        self._release = redis.register_script(_RELEASE)
        self._fenced_set = redis.register_script(_FENCED_SET)

    def value(self, token: int | None = None) -> str:
        return f"{self.holder}:{self.token if token is None else token}"

    @property
    def ttl_ms(self) -> int:
        return max(1, int(self.config.ttl_s * 1000))

    def leading(self) -> bool:
        """Whether we still count ourselves the holder (locally: the store has the last word)."""
        return self.token is not None and self.clock() < self.valid_until

    async def hold(self) -> Held:
        """Renew the lease we hold, or take it when free. Never raises: a store that
        cannot be reached leaves us without it once ``valid_until`` passes."""
        started = self.clock()
        try:
            if self.token is not None:
                if await self._extend(keys=[self.key], args=[self.value(), self.ttl_ms]):
                    self.valid_until = started + self.config.ttl_s
                    return Held(self.token)
                log.warning("lease %s: lost (token %d is no longer the holder's)", self.name, self.token)
                self.token = None
            got = await self._acquire(keys=[self.key, self.counter_key], args=[self.holder, self.ttl_ms])
        except STORE_ERRORS as e:
            if self.token is not None and not self.leading():
                log.warning("lease %s: expired while the store was unreachable", self.name)
                self.token = None
            return Held(self.token if self.leading() else None, error=f"{type(e).__name__}: {e}")
        if got is None:
            return Held(None)
        self.token, self.valid_until = int(got), started + self.config.ttl_s
        log.info("lease %s: taken with token %d", self.name, self.token)
        return Held(self.token, new=True)

    async def valid(self, token: int) -> bool:
        """Whether ``token`` is the live lease's, asked of the store (fencing)."""
        try:
            return await self.redis.get(self.key) == self.value(token)
        except STORE_ERRORS:
            return False  # no store, no proof: refuse

    async def fenced_set(self, key: str, payload: str) -> bool:
        """Write ``key`` only while we hold the lease."""
        if self.token is None:
            return False
        try:
            return bool(await self._fenced_set(keys=[self.key, key], args=[self.value(), payload]))
        except STORE_ERRORS:
            return False

    async def release(self) -> None:
        """Give the lease up at once (a clean shutdown: no one waits out the TTL)."""
        if self.token is None:
            return
        try:
            await self._release(keys=[self.key], args=[self.value()])
        except STORE_ERRORS:
            pass
        self.token = None

    async def current(self) -> tuple[str, int] | None:
        """Who holds the lease now, and with which token (None: nobody, or no store)."""
        try:
            v = await self.redis.get(self.key)
        except STORE_ERRORS:
            return None
        if not v:
            return None
        holder, _, token = v.rpartition(":")
        return holder, int(token)

    # ---- presence ---------------------------------------------------------------------------
    async def present(self, wall: float | None = None) -> None:
        """Say this replica is alive (a heartbeat, every renewal)."""
        try:
            await self.redis.zadd(self.presence_key, {self.holder: wall or time.time()})
        except STORE_ERRORS:
            pass

    async def others_alive(self, wall: float | None = None) -> int:
        """Replicas other than this one seen within the TTL (0 when the store is gone)."""
        now = wall or time.time()
        try:
            await self.redis.zremrangebyscore(self.presence_key, "-inf", now - 2 * self.config.ttl_s)
            seen = await self.redis.zrangebyscore(self.presence_key, now - self.config.ttl_s, "+inf")
        except STORE_ERRORS:
            return 0
        return sum(1 for h in seen if h != self.holder)

    async def absent(self) -> None:
        try:
            await self.redis.zrem(self.presence_key, self.holder)
        except STORE_ERRORS:
            pass
