"""The elastic controller of one pool: observe, decide, act through effects.

Each probe interval it looks at every instance (the provider: is the process there? the engine:
what does ``/ready`` say? asked of ready instances every ``ready_probe_interval_s``). Each tick it
builds the pool's signals (arrivals, TTFT and e2e from the gateway's request observers; queue depth
from the pool; load from the ready instances' ``/load`` reports) and takes
:func:`~llmserve.autoscale.scaling_step.scaling_step`, the simulator's code too; the batch runner
reads its ``realtime_load`` (:mod:`llmserve.autoscale.outlook`). Whatever it observes or decides
becomes effects (:mod:`llmserve.autoscale.effects`) that its
:class:`~llmserve.autoscale.executor.Executor` applies to its InstanceBook, the provider and the gateway pool.

The rules that protect requests: an instance joins the gateway's pool only once ``/ready`` answered
200 (a cold instance never gets traffic); a drain stops new requests, waits until neither the
gateway nor the engine has any in flight (or ``drain_timeout_s``), then leaves the pool and stops
(``stopping``: SIGTERM; ``stopped`` once it exited); a failed instance (exited, died, unreachable
for ``unready_grace_s``) leaves the pool at once and is replaced, with a back-off while replacements
fail before they get ready, until ``max_start_failures`` in a row (``start_failures.py``). Every transition is a :class:`~llmserve.autoscale.history.Event` with a
time and a reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import httpx

from llmserve.autoscale.book import InstanceBook
from llmserve.autoscale.build import build_policy
from llmserve.autoscale.capacity_actions import CapacityLedger, NoReclaim
from llmserve.autoscale.collector import SignalCollector, estimate_prompt_tokens
from llmserve.autoscale.config import AutoscaleConfig
from llmserve.autoscale.controller_views import PoolViews, sample
from llmserve.autoscale.effects import Draining, Effect, Fail, Start, Stop, drain_effects, plan_effects, probe_effects
from llmserve.autoscale.executor import Executor
from llmserve.autoscale.history import History
from llmserve.autoscale.managed import ControllerConfig, ManagedInstance
from llmserve.autoscale.metrics import AutoscaleMetrics
from llmserve.autoscale.outlook import realtime_load
from llmserve.autoscale.overrides import ManualOverride
from llmserve.autoscale.probe import EngineEndpoints, HttpProber, Prober
from llmserve.autoscale.provider_launcher import LaunchReports, PoolRouter, ProviderLauncher
from llmserve.autoscale.providers.base import InstanceProvider, InstanceSpec, RunStatus
from llmserve.autoscale.reconcile import InstanceStatus, ScalePlan
from llmserve.autoscale.scaling_step import Override, Planner, scaling_step
from llmserve.autoscale.signals import PoolSignals
from llmserve.gateway.pool import Pool
from llmserve.lifecycle import InstanceState

log = logging.getLogger(__name__)
S = InstanceState
__all__ = ["ControllerConfig", "NoReclaim", "PoolController"]

SpecFactory = Callable[[str], InstanceSpec]


class PoolController(PoolViews):
    """Scales one gateway pool (one model version) through one provider.

    It is a gateway service (``start``/``stop`` with the gateway, ``dashboard()`` for the
    dashboard) and a request observer (``on_*``) of its ``versions``: its own and the LoRA
    adapters its instances serve, whose traffic is its load. Its instances are its
    :class:`InstanceBook`'s; every change is an effect its :class:`Executor` applies.
    """

    def __init__(self, pool: Pool, model: str, version: str, autoscale: AutoscaleConfig,
                 provider: InstanceProvider, spec_factory: SpecFactory,
                 config: ControllerConfig | None = None, *, metrics: AutoscaleMetrics | None = None,
                 prober: Prober | None = None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, id_prefix: str | None = None,
                 instance_api_key: str | None = None, close_provider: bool = True,
                 endpoints: EngineEndpoints | None = None, adapter_versions: Iterable[str] = ()) -> None:
        self.pool = pool
        pool.can_grow = True  # queued requests wait for this controller's starts
        self._close_provider = close_provider  # False where pools share it and another closes it
        self.model = model
        self.version = version
        self.versions = frozenset((version, *adapter_versions))
        self.autoscale = autoscale
        self.provider = provider
        self.config = cfg = config or ControllerConfig()
        self.metrics = metrics
        self.clock = clock
        self.wall = wall
        self.policy = build_policy(autoscale)
        self.policy_state: Any = self.policy.initial_state()
        self.realtime_load: float | None = None  # the forecast's, in instances (None: no forecast)
        # The window starts now (the simulator's at 0): early arrivals are not spread over a whole one.
        self.collector = SignalCollector(cfg.signal_window_s, cfg.latency_window_s, cfg.output_tokens_prior,
                                         start=clock())
        self.history = History()
        self.book: InstanceBook[ManagedInstance] = InstanceBook(clock, wall, self.history)
        self.book.listeners.append(self._heard)
        labels = (model, version)
        self.launcher = ProviderLauncher(self.book, provider, spec_factory, cfg.stop_grace_s, self.key)
        self.router = PoolRouter(self.book, pool)
        self._prefix = id_prefix if id_prefix is not None else f"{version}-"
        self._next_id = 1
        self.executor = Executor(self.book, self.launcher, self.router, self._new_id, cfg.restart_backoff_s,
                                 cfg.max_restart_backoff_s, metrics, labels, self.key, cfg.max_start_failures)
        self.capacity = CapacityLedger(autoscale.capacity, autoscale.bounds.min_instances, self.book, metrics,
                                        labels, self.key)
        self.launcher.reports = LaunchReports(self.executor.started, self.executor.start_failed, self.executor.exited,
                                              lambda inst, why: self.capacity.setback(inst, "refused", why))
        self.desired = 0
        self.last_signals: PoolSignals | None = None
        self.manual = ManualOverride(autoscale.bounds.max_instances, self.history, clock, wall, labels, metrics)
        self._prober = prober
        self._endpoints = endpoints  # None: llmserve engine's /ready and /load
        self._probe_headers = {"authorization": f"Bearer {instance_api_key}"} if instance_api_key else None
        self._client: httpx.AsyncClient | None = None
        self._last_billing: float | None = None
        self._next_tick: float | None = None
        self._loop_task: asyncio.Task | None = None
        if metrics is not None:
            metrics.attach(self)

    def _new_id(self) -> str:
        self._next_id += 1
        return f"{self._prefix}{self._next_id - 1}"

    def _heard(self, inst: ManagedInstance, old: InstanceState, new: InstanceState, now: float) -> None:
        log.info("%s: %s %s -> %s (%s)", self.key, inst.id, old.value, new.value, inst.reason)
        if self.metrics is not None:
            self.metrics.transitions.labels(self.model, self.version, old.value, new.value).inc()

    @property
    def instances(self) -> dict:
        return self.book.instances

    @property
    def metrics(self) -> AutoscaleMetrics | None:
        return self._metrics

    @metrics.setter
    def metrics(self, metrics: AutoscaleMetrics | None) -> None:
        self._metrics = metrics  # its parts count into the same
        for part in filter(None, (getattr(self, n, None) for n in ("executor", "capacity", "manual"))):
            part.metrics = metrics

    @property
    def cost_dollars(self) -> dict[str, float]:
        return self.capacity.cost_dollars

    def counts(self) -> dict[InstanceState, int]:
        return self.book.counts()

    def provisioned(self) -> int:
        return self.book.provisioned()

    def class_counts(self) -> dict[str, int]:
        return self.capacity.class_counts()

    def spot_ok(self, now: float) -> bool:
        return self.capacity.spot_ok(now)

    # ---- gateway service ---------------------------------------------------------------
    @property
    def key(self) -> str:
        return f"{self.model}/{self.version}"

    async def start(self) -> None:
        if self._prober is None:
            self._client = httpx.AsyncClient(headers=self._probe_headers)
            self._prober = HttpProber(self._client, self.config.probe_timeout_s, self._endpoints)
        self._loop_task = asyncio.create_task(self._run(), name=f"controller {self.key}")

    async def stop(self) -> None:
        """Stop the loop, then every instance: out of the pool, drained, stopped."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass
        if self.instances:
            log.info("%s: stopping %d instance(s)", self.key, len(self.instances))
        why = "controller shutting down"
        for inst in self.book:
            if inst.state is not S.STOPPING:
                if inst.state is S.READY:  # out through draining, but not timed as a drain
                    self.book.transition(inst, S.DRAINING, why)
                self.executor.apply([Stop(inst.id, why)], self.clock())
        tasks = list(self.launcher.tasks.values())
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._close_provider:
            await self.provider.close()
        if self._client is not None:
            await self._client.aclose()

    async def _run(self) -> None:
        while True:
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad step must not stop the pool's scaling
                log.exception("controller %s: step failed", self.key)
            await asyncio.sleep(self.config.probe_interval_s)

    async def step(self) -> None:
        """One probe round; a policy tick too when one is due."""
        await self.observe()
        now = self.clock()
        if self._next_tick is None or now >= self._next_tick:
            self.tick(now)
            tick_s = self.autoscale.tick_s
            self._next_tick = now + tick_s if self._next_tick is None else max(self._next_tick + tick_s, now)

    # ---- request observer ---------------------------------------------------------------
    def on_arrival(self, model: str, version: str, t: float, prompt_chars: int, batch: bool = False) -> None:
        if model == self.model and version in self.versions:
            self.collector.record_arrival(t, estimate_prompt_tokens(prompt_chars, self.config.chars_per_token), batch)

    def on_first_token(self, model: str, version: str, t: float, ttft_s: float, batch: bool = False) -> None:
        if model == self.model and version in self.versions:
            self.collector.record_first_token(t, ttft_s, batch)

    def on_finish(self, model: str, version: str, t: float, e2e_s: float, output_tokens: int,
                  ok: bool, batch: bool = False) -> None:
        if ok and model == self.model and version in self.versions:
            self.collector.record_finish(t, e2e_s, output_tokens, batch)

    def on_batch_need(self, model: str, lines_per_s: float) -> None:
        if model == self.model:  # every version's pool is told the model's whole need
            self.collector.set_batch_need(lines_per_s)

    # ---- observing ---------------------------------------------------------------------------
    async def observe(self) -> None:
        now = self.clock()
        self._bill(now)
        live = [i for i in self.book if i.handle is not None and i.state is not S.STOPPING]
        runs = await asyncio.gather(*(self.provider.status(i.handle) for i in live))
        due = [(i, run) for i, run in zip(live, runs) if self._probe_due(i, now)]
        probes = await asyncio.gather(*(self._prober.ready(i.handle, run) for i, run in due))
        now = self.clock()
        act = self.executor.apply
        for (inst, _), probe in zip(due, probes):
            inst.last_probe, inst.probed_at = probe, now
            act(probe_effects(inst.id, inst.state, probe, now - inst.created, self.config.start_timeout_s), now)
        for inst, run in zip(live, runs):
            if inst.state in (S.READY, S.DRAINING):
                act(self._watch_serving(inst, run, now), now)
        for inst, run in zip(live, runs):
            if run.reclaim_at is not None and inst.reclaim_at is None:
                act(self.capacity.notice(inst, run.reclaim_at), now)
        for effects in self.capacity.slow_spot(now):
            act(effects, now)
        timeout = self.config.start_timeout_s
        act([Fail(i.id, f"the provider gave no address within {timeout:g}s") for i in self.book
             if i.handle is None and i.state is not S.STOPPING and now - i.created > timeout], now)
        await self._advance_drains(now)
        act([Start(f"replaces {failed}, which failed", self.capacity.replacement_class(failed), replaces=failed)
             for failed in self.executor.due_replacements(now)], now)

    def _probe_due(self, inst: ManagedInstance, now: float) -> bool:
        if inst.state in (S.STARTING, S.WARMING):
            return True
        return inst.state is S.READY and (
            inst.probed_at is None or now - inst.probed_at >= self.config.ready_probe_interval_s)

    def _watch_serving(self, inst: ManagedInstance, run: RunStatus, now: float) -> list[Effect]:
        if inst.id not in self.instances:
            return []
        if run.gone:
            return [Fail(inst.id, f"{run.detail or run.state.value} while {inst.state.value}")]
        seen = self.pool.get(inst.id)
        if seen is None or seen.ready or inst.state is not S.READY:
            inst.unready_since = None
            return []
        if inst.unready_since is None:
            inst.unready_since = now
        elif now - inst.unready_since > self.config.unready_grace_s:
            return [Fail(inst.id, f"not answering /ready for {now - inst.unready_since:.0f}s")]
        return []

    async def _advance_drains(self, now: float) -> None:
        draining = self.book.in_state(S.DRAINING)
        if not draining:
            return
        loads = await asyncio.gather(*(self._prober.load(i.handle) for i in draining))
        seen = []
        for inst, report in zip(draining, loads):
            if inst.state is not S.DRAINING:
                continue  # revived, failed or stopping while we waited for the report
            inst.last_load = report or inst.last_load
            engine = (report.num_running + report.num_waiting) if report is not None else None
            seen.append(Draining(inst.id, self.router.in_flight(inst), engine, now - (inst.drain_started or now)))
        self.executor.apply(drain_effects(seen, self.config.drain_timeout_s), now)

    def _bill(self, now: float) -> None:
        if self._last_billing is not None:
            if self.metrics is not None:
                billed = sum(1 for i in self.book if i.state.billed)
                self.metrics.instance_seconds.labels(self.model, self.version).inc(billed * (now - self._last_billing))
            self.capacity.bill(now - self._last_billing)
        self._last_billing = now

    # ---- deciding -----------------------------------------------------------------------------
    def signals(self, now: float) -> PoolSignals:
        loads = []
        for inst in self.book:
            seen = self.pool.get(inst.id)
            if inst.state is S.READY and seen is not None and seen.report is not None:
                loads.append(seen.report)
        seen = self.pool.stats()
        return self.collector.snapshot(now, loads, seen.queue_depth, self.counts(), seen.inflight)

    def tick(self, now: float) -> None:
        """Decide and reconcile (synchronous: starts and stops run as tasks)."""
        ctx = self.signals(now)
        self.last_signals = ctx
        step = scaling_step(self.policy, self.policy_state, ctx, self.statuses(), self._active_override(now),
                            self.executor.start_not_before, self.planner())
        self.policy_state = step.state
        self.realtime_load = realtime_load(self.policy, step.state, now)
        wall = self.wall()
        self.desired = step.desired
        self.history.decision(wall, step.provisioned, step.desired, step.reason, step.source, step.policy_desired)
        self.history.sample(sample(wall, ctx, step.desired))
        if step.changes:
            if self.metrics is not None:
                direction = "up" if step.desired > step.provisioned else "down"
                self.metrics.decisions.labels(self.model, self.version, direction, step.source).inc()
            if self.executor.gave_up is None:  # else said once, when it gave up
                log.info("%s: %d -> %d (%s)", self.key, step.provisioned, step.desired, step.reason)
        if step.held_starts and self.executor.gave_up is None:
            log.info("%s: %d start(s) held by restart backoff for %.0fs", self.key, step.held_starts,
                     self.executor.start_not_before - now)
        self.apply(step.plan, step.reason, now)

    def statuses(self) -> list[InstanceStatus]:
        """What reconciliation sees: instances not on their way out (stopping, or under
        a reclaim notice: its replacement is already on its way)."""
        return self.book.statuses(self.router.in_flight)

    def planner(self) -> Planner:
        """Which instances to act on: by capacity class when spot is on."""
        return self.capacity.plan

    def apply(self, plan: ScalePlan, reason: str, now: float) -> None:
        self.executor.apply(plan_effects(plan, reason), now)

    async def reclaim(self, instance_id: str, notice_s: float) -> float:
        """Ask the provider to reclaim an instance (operators, tests, benchmarks): its
        deadline (unix time). Needs a provider with ``reclaim`` (the local one)."""
        inst = self.instances.get(instance_id)
        if inst is None or inst.handle is None:
            raise NoReclaim(f"no started instance {instance_id!r} in {self.key}")
        take = getattr(self.provider, "reclaim", None)
        if take is None:
            raise NoReclaim(f"the {self.provider.name} provider cannot simulate reclaims")
        at = await take(inst.handle, notice_s)
        if at is None:
            raise NoReclaim(f"instance {instance_id!r} is not running")
        if inst.reclaim_at is None and inst.id in self.instances:
            self.executor.apply(self.capacity.notice(inst, at), self.clock())
        return at

    def _active_override(self, now: float) -> Override | None:
        return self.manual.active(now)

    @property
    def override(self) -> Override | None:
        return self.manual.override

    def override_active(self) -> bool:
        return self._active_override(self.clock()) is not None

    def set_override(self, instances: int | None, duration_s: float | None, reason: str) -> Override | None:
        """Pin the instance count (``None`` clears it); counted as a manual intervention."""
        o = self.manual.set(instances, duration_s, reason)
        self._next_tick = None  # act on it at the next step, not a tick later
        return o

    def retry(self, why: str = "an operator asked") -> bool:
        """Start instances again in a pool that gave up (start_failures.py); False: it had not."""
        self._next_tick = None  # the plan's starts at the next step, not a tick later
        return self.executor.retry(why)
