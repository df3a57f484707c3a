"""The limiter on the request path: admit a request of a named key, or refuse it with 429.

One decision module (``decision``), two stores: with ``state.redis_url`` the counters
are Redis's (``redis_store``), shared by every replica, else this process's
(``store.MemoryStore``). When Redis stops answering, each replica goes on alone with
a ``1/state.replicas`` share of every key's limits (and of what was left of each budget)
in memory, says so in ``/ready`` and ``llmserve:gateway_limits_degraded``, and goes back
to Redis once a probe reaches it again (the local counts are then dropped: Redis's
own, which lapse with their windows, apply again).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING

from redis import exceptions as redis_errors

from llmserve.api.errors import APIError
from llmserve.gateway.tenants.config import KeyLimits, Prices
from llmserve.gateway.tenants.decision import (MICRO, Ask, Denied, Kind, Limit, Reply, admission_asks, estimate,
                                               local_share, rate_headers, verdict)
from llmserve.gateway.tenants.redis_store import RedisStore
from llmserve.gateway.tenants.store import CounterStore, MemoryStore
from llmserve.gateway.tenants.tab import Tab
from llmserve.gateway.tenants.usage import KeyUsage
from llmserve.state.redis_conn import StoreUnreachable, client, connect, redact

if TYPE_CHECKING:
    from llmserve.gateway.batches.config import StateConfig
    from llmserve.gateway.config import GatewayConfig
    from llmserve.gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)

# Any store failure, not only a lost connection (an OOM refusal, a failed script): serve on locally.
_UNREACHABLE = (redis_errors.RedisError, OSError)
_FREE = Prices()


class Tenants:
    """Per-key limits for the proxy (``admit``) and the usage API; started with the gateway."""

    def __init__(self, keys: dict[str, KeyLimits | None], prices: dict[str, Prices], state: StateConfig,
                 hold_s: float, metrics: GatewayMetrics, probe_s: float = 1.0) -> None:
        self.keys = keys  # every named key; None: counted in the metrics, never limited
        self.prices = prices
        self.state = state
        self.hold_s = hold_s  # a concurrency hold lapses after this (a replica that died holds none for ever)
        self.probe_s = probe_s
        self.local: CounterStore = MemoryStore()
        self.shared: RedisStore | None = None
        self.down_since: float | None = None  # wall clock; None: the shared store answers (or none is used)
        self.usage = KeyUsage(metrics, prices, lambda: self.down_since is not None)
        self._known: dict[str, int] = {}  # budget counter -> what Redis last said it held
        self._tasks: set[asyncio.Task] = set()

    @classmethod
    def from_config(cls, config: GatewayConfig, metrics: GatewayMetrics) -> Tenants:
        keys = {k.name: k.limits for k in config.auth.keys if k.name is not None}
        prices = {m.name: Prices(prompt=m.price_per_1k_prompt_tokens, completion=m.price_per_1k_completion_tokens)
                  for m in config.models}
        return cls(keys, prices, config.state, config.limits.request_timeout_s + 60.0, metrics)

    @property
    def limited(self) -> bool:
        return any(v is not None for v in self.keys.values())

    async def start(self) -> None:
        url = self.state.redis_url
        if url is None or not self.limited:
            return
        try:  # a wrong password is a StoreError here: the replica refuses to start
            self.shared = RedisStore(await connect(url, self.state.redis_password_file))
        except StoreUnreachable as e:
            self.shared = RedisStore(client(url, self.state.redis_password_file))
            self.unreachable(e)
        log.info("key limits shared through Redis at %s", redact(url))

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.shared is not None:
            await self.shared.close()

    async def admit(self, key: str | None, model: str, body: dict, prompt_chars: int, stream: bool,
                    request_id: str, budget_only: bool = False) -> Tab | None:
        """The request's tab (None: an unnamed key, nothing to count); raises a 429
        APIError with Retry-After when a limit refuses it. ``budget_only``: a batch line,
        held to the key's budget alone."""
        if key is None or key not in self.keys:
            return None
        limits, prices = self.keys[key], self.prices.get(model, _FREE)
        if limits is None:
            self.counted(key, "admitted")
            return Tab(self, key, model, KeyLimits(), prices, None, [], 0, 0, stream)
        def asks_for(completion: int) -> list[Ask]:
            asks = admission_asks(key, limits, prices, prompt, completion, time.time(), request_id, self.hold_s)
            return [a for a in asks if a.limit is Limit.BUDGET] if budget_only else asks

        prompt, completion = estimate(limits, prompt_chars, body)
        asks = asks_for(completion)
        denied, store, headers = await self._reserve(key, asks)
        batch, whole = limits.stream_charge_tokens, True
        if denied is not None and denied.limit is Limit.BUDGET and stream and completion > batch:
            # The whole answer does not fit what is left: a stream may still have what does,
            # reserved batch by batch as it runs (one script call per batch, so only here).
            completion, whole = batch, False
            asks = asks_for(completion)
            denied, store, headers = await self._reserve(key, asks)
        if denied is not None:
            self.counted(key, denied.limit.value)
            wait = denied.retry_after_s
            raise APIError(429, denied.message, type_=denied.type, code=denied.code,
                           headers=headers if wait is None else {**headers, "retry-after": str(wait)})
        self.counted(key, "admitted")
        tab = Tab(self, key, model, limits, prices, store, asks, prompt, completion, stream, whole)
        tab.rate_headers = headers
        return tab

    async def reserve(self, key: str, asks: list[Ask]) -> tuple[Denied | None, CounterStore]:
        """Reserve ``asks`` in the shared store, or in this replica's share while it is away."""
        denied, store, _ = await self._reserve(key, asks)
        return denied, store

    async def _reserve(self, key: str, asks: list[Ask]) -> tuple[Denied | None, CounterStore, dict[str, str]]:
        """``reserve``, with the rate-limit headers of the store's reply."""
        now = time.time()
        if self.shared is not None and self.down_since is None:
            try:
                reply = await self.shared.reserve(asks, now)
            except _UNREACHABLE as e:
                self.unreachable(e)
            else:
                self._remember(asks, reply)
                return verdict(key, asks, reply, now), self.shared, rate_headers(asks, reply, now)
        if self.shared is not None:
            asks = [local_share(a, self.state.replicas, self._known.get(a.key) if a.limit is Limit.BUDGET else None)
                    for a in asks]
        reply = await self.local.reserve(asks, now)
        return verdict(key, asks, reply, now), self.local, rate_headers(asks, reply, now)

    def _remember(self, asks: list[Ask], reply: Reply) -> None:
        for a, used in zip(asks, reply.used):  # (all or nothing: a refusal added no cost)
            if a.limit is Limit.BUDGET:
                self._known[a.key] = used + (a.cost if reply.failed < 0 else 0)

    def unreachable(self, error: BaseException) -> None:
        """The shared store did not answer: enforce local shares until a probe reaches it."""
        if self.shared is None or self.down_since is not None:
            return
        self.down_since = time.time()
        self.local = MemoryStore()
        log.warning("Redis is unreachable (%s): enforcing 1/%d of every key's limits locally until it "
                    "returns", error, self.state.replicas)
        self.background(self._probe())

    async def _probe(self) -> None:
        while True:
            await asyncio.sleep(self.probe_s)
            try:
                await self.shared.client.ping()
            except _UNREACHABLE:
                continue
            log.warning("Redis answers again: key limits are shared again (down %.1f s)",
                        time.time() - self.down_since)
            self.down_since = None
            return

    def status(self) -> dict:
        """For ``/ready``: where the counters are and whether this replica is on its own."""
        if self.shared is None:
            return {"store": "memory", "degraded": False}
        out = {"store": "redis", "degraded": self.down_since is not None, "replicas": self.state.replicas}
        if self.down_since is not None:
            out.update(local_share=f"1/{self.state.replicas}", since=round(self.down_since, 3),
                       reason="Redis is unreachable: each key's limits are enforced as this replica's share")
        return out

    async def report(self, key: str) -> dict:
        """What ``key`` has used now, as every replica counts it (or this one, degraded)."""
        if key not in self.keys:
            raise APIError(404, f"no key named {key!r}", code="key_not_found")
        limits, now = self.keys[key], time.time()
        out: dict = {"key": key, "this_replica": dict(self.usage.total(key)), "limits": {}}
        if limits is None:
            return out
        asks = admission_asks(key, limits, Prices(), 0, 0, now, "-", 0)
        shared = self.shared is not None and self.down_since is None
        try:
            used = await (self.shared if shared else self.local).used(asks, now)
        except _UNREACHABLE as e:  # the store went away: report this replica's share
            self.unreachable(e)
            shared, used = False, await self.local.used(asks, now)
        out["counted_by"] = "every replica (redis)" if shared else "this replica"
        for ask, u in zip(asks, used):
            entry: dict = {"used": u, "limit": ask.cap}
            if ask.kind is Kind.WINDOW and ask.limit is not Limit.BUDGET:
                entry["window_s"] = limits.window_s
            if ask.limit is Limit.BUDGET:
                b = limits.budget
                entry.update(period=b.period.value, resets_at=ask.resets_at)
                if b.amount is not None:
                    entry.update(used=u / MICRO, limit=b.amount)
            out["limits"][ask.limit.value] = entry
        return out

    def counted(self, key: str, outcome: str) -> None:
        self.usage.request(key, outcome)

    def used(self, key: str, model: str, prompt: int, completion: int) -> None:
        self.usage.tokens(key, model, prompt, completion)

    def background(self, work: Coroutine) -> None:
        """Run ``work`` (a settlement, the probe) without the request waiting for it."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
