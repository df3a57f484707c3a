"""The gateway's runtime: models, pools, routers, canaries and the monitor, with no HTTP.

:class:`Gateway` owns them, starts and stops the polls, the canary ticks and the
gateway services; ``app`` serves it over HTTP and the autoscaler reaches a pool
with ``gateway.pool(model, version)`` (see ``pool.py`` for the pool's run-time
interface). A :class:`ModelRuntime` is handed what its requests' records feed
(the gateway's metrics and observers, its own window stats) rather than the
gateway: nothing below the gateway reaches back up into it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import suppress
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from llmserve.gateway.adapter_load import adapters_of
from llmserve.gateway.canary import Action, CanaryAnalysis, CanaryState
from llmserve.gateway.config import GatewayConfig, ServedModelConfig
from llmserve.gateway.events import GatewayService, RequestObserver
from llmserve.gateway.health import RetryBudget
from llmserve.gateway.metrics import GatewayMetrics, gauge
from llmserve.gateway.monitor import Monitor
from llmserve.gateway.pool import Pool
from llmserve.gateway.recorder import RecordSinks
from llmserve.gateway.tenants.limiter import Tenants
from llmserve.gateway.timeline import Timeline
from llmserve.gateway.upstream import UpstreamClient
from llmserve.gateway.version_router import VersionRouter, with_weight
from llmserve.state.gateway_state import GatewayState, open_state

if TYPE_CHECKING:
    from llmserve.tracing.gateway import GatewayTelemetry

log = logging.getLogger(__name__)


class ModelRuntime:
    """One served model: its version router, one pool per version, its canary.

    ``metrics`` and ``observers`` are the gateway's (``observers`` is its list itself,
    so services that join later are seen); ``sinks`` adds this model's window stats."""

    def __init__(self, config: ServedModelConfig, gateway_config: GatewayConfig, *,
                 metrics: GatewayMetrics, observers: list[RequestObserver],
                 rng: random.Random, telemetry: GatewayTelemetry | None = None) -> None:
        self.config = config
        self.name = config.name
        self.pools: dict[str, Pool] = {}  # by version, for the versions with a pool of their own
        # Looked up on every request: dicts, not scans of the config's list. An adapter
        # version is sent to its pool's instances with "model" the adapter's name.
        self.adapters = {v.name: v.adapter for v in config.versions if v.adapter is not None}
        self.upstream_models = {v.name: v.adapter.name if v.adapter else v.upstream_model
                                for v in config.versions}
        if config.aliases:  # a request by an alias reaches its instances under the model's own name
            self.upstream_models = {v: m or config.name for v, m in self.upstream_models.items()}
        own = {v.name: v.api_key and f"Bearer {v.api_key.get_secret_value()}" for v in config.versions}
        self.upstream_auth = {v.name: own[config.pool_of(v.name)] for v in config.versions}
        self.count_forced = config.canary is not None and config.canary.count_forced
        for v in config.versions:
            if v.adapter is not None:
                continue
            pool = Pool(f"{config.name}/{v.name}", admission=config.admission,
                        concurrency=config.concurrency, balancer=config.balancer,
                        breaker=gateway_config.breaker, outlier=gateway_config.outlier,
                        report_ttl_s=max(2.0, 8 * gateway_config.polling.load_interval_s),
                        rng=random.Random(rng.random()))
            for url in v.upstreams:
                pool.add_instance(url)
            self.pools[v.name] = pool
        self.pool_of = {v.name: self.pools[config.pool_of(v.name)] for v in config.versions}
        self.canary: CanaryAnalysis | None = None
        self._not_judged: str | None = None
        if config.canary is not None:
            self.canary = CanaryAnalysis(config.canary.version, config.canary.stable,
                                         config.canary)
        self.sinks = RecordSinks(config.name, metrics, self.canary, observers, telemetry)
        self.router = VersionRouter(self._weights(), salt=config.name,
                                    rng=random.Random(rng.random()),
                                    stickiness_window_s=config.stickiness_window_s)
    def _weights(self) -> dict[str, float]:
        base = self.config.base_weights
        if self.canary is None:
            return base
        return with_weight(base, self.canary.canary, self.canary.weight)

    def apply_weights(self) -> None:
        self.router.set_weights(self._weights())

    def tick(self, now: float) -> Action:
        if self.canary is None:
            return Action.NONE
        if self.canary.state is CanaryState.PROGRESSING:
            # Remembered until the next check: one cold moment spoils the interval.
            short = self.pool_of[self.canary.canary].capacity_shortfall()
            self._not_judged = f"not judged: the canary pool {short}" if short else self._not_judged
        d = self.canary.tick(now, self._not_judged)
        self.sinks.metrics.canary_decided(self.name, self.canary.canary, d.action.value)
        if d.action is not Action.NONE:
            self._not_judged = None
        if d.action not in (Action.NONE, Action.INCONCLUSIVE):
            log.info("canary %s/%s: %s → %.0f%% (%s)", self.config.name, self.canary.canary,
                     d.action.value, 100 * d.weight, d.reason)
            self.apply_weights()
        return d.action

    def canary_action(self, action: str, reason: str) -> None:
        assert self.canary is not None
        d = getattr(self.canary, action)(time.time(), reason)
        self.sinks.metrics.canary_decided(self.name, self.canary.canary, d.action.value)
        log.info("canary %s/%s: %s by admin (%s)", self.config.name, self.canary.canary,
                 action, reason)
        self.apply_weights()

    def describe(self) -> dict:
        return {"name": self.config.name,
                "versions": [{"name": v.name, "base_weight": v.weight,
                              "weight": self.router.weights[v.name],
                              "instances": len(self.pool_of[v.name].instances()),
                              **({"pool": v.pool, "adapter": v.adapter.name} if v.adapter else {})}
                             for v in self.config.versions],
                "canary": None if self.canary is None else self.canary.status()}

    def describe_pool(self, version: str) -> dict:
        pool = self.pools[version]
        queues = {p.name.lower(): asdict(s) for p, s in pool.queue_stats().items()}
        return {"model": self.config.name, "version": version,
                "weight": self.router.weights[version], "instances": pool.snapshot(),
                "queues": queues}


class Gateway:
    """The models and what serves them all: the upstream client, the monitor, the
    retry budget, metrics, request observers and services."""

    def __init__(self, config: GatewayConfig, *, rng: random.Random | None = None,
                 telemetry: GatewayTelemetry | None = None) -> None:
        self.config = config
        self.telemetry = telemetry  # spans and access-log lines; None: neither
        rng = rng or random.Random()
        self.metrics = GatewayMetrics(self._gauges)
        self.retry_budget = RetryBudget(config.retry.budget)
        self.tenants = Tenants.from_config(config, self.metrics)  # per-key limits and usage
        self.observers: list[RequestObserver] = []  # e.g. the autoscaler's signal collector
        self.models = {m.name: ModelRuntime(m, config, metrics=self.metrics,
                                            observers=self.observers, rng=rng, telemetry=telemetry)
                       for m in config.models}
        # Started after the gateway's own tasks, stopped before them (e.g. the elastic
        # controller, which drains its instances while the proxy still works).
        self.services: list[GatewayService] = []
        # Replicas: whether this one takes a model's canary decisions now (its pool's leader);
        # None: always (one process).
        self.decides: Callable[[str], bool] | None = None
        # Set by serve when every pool may rest at zero instances: the first request starts one,
        # so /ready must not wait for one (a load balancer would never send that request).
        self.ready_at_zero = False
        # Set by serve: the pools' instances are their elastic controllers', not the admin API's.
        self.controlled = False
        self.timeline = Timeline()  # every model's pools on one time axis (admin API, dashboard)
        self.upstream: UpstreamClient | None = None  # the request path and the polls
        self.monitor: Monitor | None = None
        self._tasks: list[asyncio.Task] = []
        # Rollouts and admin overrides: this process's, or the replicas' (state.redis_url).
        self.shared = GatewayState.local()
        self.started = False
        self._starting: asyncio.Lock | None = None

    def pool(self, model: str, version: str) -> Pool:
        return self.models[model].pools[version]

    def resolve(self, name: str) -> tuple[ModelRuntime | None, str | None]:
        """The model a request's ``model`` names, and the version an alias pins (else None)."""
        if (rt := self.models.get(name)) is not None:
            return rt, None
        return next(((rt, rt.config.aliases[name]) for rt in self.models.values() if name in rt.config.aliases),
                    (None, None))

    def pools(self) -> Iterator[Pool]:
        for rt in self.models.values():
            yield from rt.pools.values()

    async def ensure_started(self) -> None:
        """Start once, on whichever comes first: the ASGI lifespan or the first request.

        A host that never sends lifespan events (a Starlette ``Mount``, a server run
        with ``lifespan="off"``) still gets the health polls and canary ticks."""
        if self.started:
            return
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if not self.started:
                await self.start()

    async def start(self) -> None:
        if self.started:
            return
        self.started = True
        await self.tenants.start()
        lim = self.config.limits
        self.upstream = UpstreamClient(connect_timeout=lim.connect_timeout_s,
                                       read_timeout=lim.request_timeout_s,
                                       # under uvicorn's 5 s keep-alive: never reuse one the engine closed
                                       keepalive_expiry=4.0)
        self.monitor = Monitor(self.pools, self.upstream, self.config.polling)
        now = time.time()
        for rt in self.models.values():
            if rt.canary is not None and rt.config.canary.auto_start:
                rt.canary.start(now, "started with the gateway")
                rt.apply_weights()
        state = self.config.state
        self.shared = await open_state(state.redis_url, state.redis_password_file, list(self.models.values()),
                                       pools=state.pools, observers=self.observers)
        await self.shared.start()  # a rollout already shared wins over auto_start
        self._tasks = [asyncio.create_task(self.monitor.run(), name="monitor"),
                       asyncio.create_task(self._canary_loop(), name="canary"),
                       asyncio.create_task(self._timeline_loop(), name="timeline")]
        for s in self.services:
            await s.start()

    async def stop(self) -> None:
        if not self.started:
            return
        self.started = False
        for s in reversed(self.services):
            await _bounded(s.stop(), f"service {s!r}")
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            await _bounded(_settled(t), f"task {t.get_name()}")
        await _bounded(self.shared.stop(), "shared state")
        if self.monitor is not None:
            self.monitor.close()
        if self.upstream is not None:
            await _bounded(self.upstream.aclose(), "upstream client")
        await _bounded(self.tenants.stop(), "key limits")
        if self.telemetry is not None and self.telemetry.tracing is not None:
            self.telemetry.tracing.shutdown()  # export what is buffered

    async def _canary_loop(self) -> None:
        intervals = [rt.config.canary.interval_s for rt in self.models.values()
                     if rt.config.canary is not None]
        if not intervals:
            return
        period = max(0.01, min(1.0, min(intervals) / 10))
        while True:
            await asyncio.sleep(period)
            now = time.time()
            for rt in self.models.values():
                if self.decides is not None and not self.decides(rt.config.name):
                    continue  # another replica leads this rollout
                try:
                    await self.shared.rollouts.tick(rt, now)
                except Exception:  # one model's bug must not stop the others' rollouts
                    log.exception("canary tick failed for %s", rt.config.name)

    async def _timeline_loop(self) -> None:
        while True:
            try:
                self.timeline.sample(self.models, time.time())
            except Exception:  # a bad sample must not stop the next ones
                log.exception("timeline sample failed")
            await asyncio.sleep(self.timeline.interval_s)

    def model_timeline(self, model: str, since: float = 0.0, limit: int = 3600) -> dict:
        return self.timeline.of_model(self.models[model], self.services, time.time(), since, limit)

    def ready(self) -> bool:
        return self.ready_at_zero or any(v.routable for p in self.pools() for v in p.views(time.monotonic()))

    def _gauges(self) -> Iterable:
        depth = gauge("queue_depth", "Requests waiting in the gateway's queue",
                      ["model", "version", "class"])
        oldest = gauge("queue_oldest_wait_seconds", "Wait of the oldest queued request",
                       ["model", "version", "class"])
        weight = gauge("version_weight", "Share of traffic routed to each version",
                       ["model", "version"])
        inflight = gauge("instance_inflight", "Requests in flight to each instance",
                         ["model", "version", "instance"])
        ready = gauge("instance_ready", "1 if the instance passes /ready",
                      ["model", "version", "instance"])
        breaker = gauge("instance_breaker_open", "0 closed, 0.5 half-open, 1 open",
                        ["model", "version", "instance"])
        adapter = gauge("instance_adapter", "1 per LoRA adapter on an instance: resident in a slot, or loaded in "
                        "memory only (its /load report and this gateway's loads since)",
                        ["model", "version", "instance", "adapter", "state"])
        level = {"closed": 0.0, "half_open": 0.5, "open": 1.0}
        for name, rt in self.models.items():
            for version, w in rt.router.weights.items():  # adapter versions too
                weight.add_metric([name, version], w)
            for version, pool in rt.pools.items():
                for p, s in pool.queue_stats().items():
                    depth.add_metric([name, version, p.name.lower()], s.depth)
                    oldest.add_metric([name, version, p.name.lower()], s.oldest_wait_s)
                for iid, state in pool.breaker_states().items():
                    inst = pool.get(iid)
                    inflight.add_metric([name, version, iid], inst.inflight)
                    ready.add_metric([name, version, iid], float(inst.ready))
                    breaker.add_metric([name, version, iid], level[state.value])
                    for state_name, names in zip(("resident", "loaded"), adapters_of(inst)):
                        for a in sorted(names):
                            adapter.add_metric([name, version, iid, a, state_name], 1.0)
        return [depth, oldest, weight, inflight, ready, breaker, adapter, *self.shared.gauges(),
                *self.metrics.canary_gauges(self.models.values())]


STOP_STEP_S = 5.0  # a stuck step (a store that hangs, a task that ignores its cancel) must not stop the exit


async def _settled(task: asyncio.Task) -> None:
    with suppress(asyncio.CancelledError):
        await task


async def _bounded(step: Awaitable[Any], what: str) -> None:
    """One shutdown step, given STOP_STEP_S; a failure or overrun is logged and the rest
    still runs. ``asyncio.wait``, not ``wait_for``: a step that ignores its cancel is left behind."""
    fut = asyncio.ensure_future(step)
    done, _ = await asyncio.wait({fut}, timeout=STOP_STEP_S)
    if not done:
        fut.cancel()
        log.warning("stopping %s took over %.0f s; going on without it", what, STOP_STEP_S)
    elif not fut.cancelled() and fut.exception() is not None:  # the gateway's own shutdown must still run
        log.error("stopping %s failed", what, exc_info=fut.exception())
