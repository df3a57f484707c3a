"""The elastic controller: the one owner of a pool's instances and their lifecycle.

Each probe interval it looks at every instance (the provider: is the process
there? the engine: what does ``/ready`` say? asked of ready instances every
``ready_probe_interval_s``) and moves it along
``starting -> warming -> ready -> draining -> stopping -> stopped`` (or ``failed``). Each
tick it builds the pool's signals (arrivals, TTFT and e2e seen by the gateway's
request observers; queue depth from the gateway's pool; running, waiting, KV,
busy fraction and throughput from the ready instances' ``/load`` reports), asks
the policy stack built by :func:`~llmserve.autoscale.build_policy` for a count,
and reconciles with :func:`~llmserve.autoscale.reconcile.plan_scaling`, the same
code the simulator runs.

The rules that protect requests:

- an instance joins the gateway's pool only once ``/ready`` answered 200 (weights
  loaded, warm-up ran), so a cold instance never gets traffic;
- draining first marks it draining in the pool (no new requests), waits until the
  gateway has nothing in flight to it and the engine reports nothing running or
  waiting (or ``drain_timeout_s`` passes), removes it from the pool, and only then
  stops it (``stopping``: SIGTERM, the engine drains whatever is left and exits 0;
  ``stopped`` once it has exited);
- an instance that fails (process exited, actor died, engine dead under a live
  process, unreachable for ``unready_grace_s``) leaves the pool at once and is
  replaced, with a backoff while replacements keep failing before they get ready.

Every transition is an :class:`~llmserve.autoscale.history.Event` with a time and
a reason; every tick's decision is kept with the policy's reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import httpx

from llmserve.autoscale.build import build_policy
from llmserve.autoscale.capacity_actions import CapacityActions
from llmserve.autoscale.collector import SignalCollector, estimate_prompt_tokens
from llmserve.autoscale.config import AutoscaleConfig
from llmserve.autoscale.controller_views import ControllerViews
from llmserve.autoscale.instance_actions import InstanceActions
from llmserve.autoscale.history import History
from llmserve.autoscale.managed import ControllerConfig, ManagedInstance
from llmserve.autoscale.metrics import AutoscaleMetrics
from llmserve.autoscale.probe import EngineEndpoints, HttpProber, Probe, Prober, judge, path
from llmserve.autoscale.providers.base import InstanceProvider, InstanceSpec, RunStatus
from llmserve.autoscale.capacity_mix import ON_DEMAND
from llmserve.autoscale.reconcile import InstanceStatus, ScalePlan, plan_scaling
from llmserve.autoscale.scaling_step import Override, Planner, scaling_step
from llmserve.autoscale.signals import PoolSignals
from llmserve.gateway.pool import Pool
from llmserve.lifecycle import InstanceState

log = logging.getLogger(__name__)
S = InstanceState


SpecFactory = Callable[[str], InstanceSpec]


class PoolController(InstanceActions, CapacityActions, ControllerViews):
    """Scales one gateway pool (one model version) through one provider.

    It is a gateway service (``start``/``stop`` with the gateway, ``dashboard()``
    for the dashboard) and a request observer (the gateway calls ``on_arrival``,
    ``on_first_token`` and ``on_finish`` for every request; those of other pools
    are ignored).
    """

    def __init__(self, pool: Pool, model: str, version: str, autoscale: AutoscaleConfig,
                 provider: InstanceProvider, spec_factory: SpecFactory,
                 config: ControllerConfig | None = None, *, metrics: AutoscaleMetrics | None = None,
                 prober: Prober | None = None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, id_prefix: str | None = None,
                 instance_api_key: str | None = None, close_provider: bool = True,
                 endpoints: EngineEndpoints | None = None) -> None:
        self.pool = pool
        pool.can_grow = True  # queued requests wait for this controller's starts
        self._close_provider = close_provider  # False where pools share it and another closes it
        self.model = model
        self.version = version
        self.autoscale = autoscale
        self.provider = provider
        self.spec_factory = spec_factory
        self.config = config or ControllerConfig()
        self.metrics = metrics
        self.clock = clock
        self.wall = wall
        self.policy = build_policy(autoscale)
        self.policy_state: Any = self.policy.initial_state()
        cfg = self.config
        self.collector = SignalCollector(cfg.signal_window_s, cfg.latency_window_s, cfg.output_tokens_prior)
        self.history = History()
        self.instances: dict[str, ManagedInstance] = {}  # not yet stopped or failed
        self.finished: deque[ManagedInstance] = deque(maxlen=100)
        self.desired = 0
        self.last_signals: PoolSignals | None = None
        self.override: Override | None = None
        self._prober = prober
        self._endpoints = endpoints  # None: llmserve engine's /ready and /load
        self._probe_headers = {"authorization": f"Bearer {instance_api_key}"} if instance_api_key else None
        self._client: httpx.AsyncClient | None = None
        self._prefix = id_prefix if id_prefix is not None else f"{version}-"
        self._next_id = 1
        self._tasks: dict[str, asyncio.Task] = {}  # start or stop in progress, by instance id
        self._replacements: deque[str] = deque()  # ids of failed instances owed a replacement
        self._failures_before_ready = 0
        self._start_not_before = 0.0
        self._last_billing: float | None = None
        self._next_tick: float | None = None
        self._loop_task: asyncio.Task | None = None
        self._init_capacity()
        if metrics is not None:
            metrics.attach(self)

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
        for inst in list(self.instances.values()):
            if inst.state is not S.STOPPING:
                if inst.state is S.READY:
                    self._transition(inst, S.DRAINING, "controller shutting down")
                self._begin_stop(inst, "controller shutting down")
        tasks = list(self._tasks.values())
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
    def on_arrival(self, model: str, version: str, t: float, prompt_chars: int) -> None:
        if model == self.model and version == self.version:
            self.collector.record_arrival(t, estimate_prompt_tokens(prompt_chars, self.config.chars_per_token))

    def on_first_token(self, model: str, version: str, t: float, ttft_s: float) -> None:
        if model == self.model and version == self.version:
            self.collector.record_first_token(t, ttft_s)

    def on_finish(self, model: str, version: str, t: float, e2e_s: float, output_tokens: int,
                  ok: bool) -> None:
        if ok and model == self.model and version == self.version:
            self.collector.record_finish(t, e2e_s, output_tokens)

    # ---- counts ------------------------------------------------------------------------------
    def counts(self) -> dict[InstanceState, int]:
        out = {s: 0 for s in InstanceState}
        for i in self.instances.values():
            out[i.state] += 1
        return out

    def provisioned(self) -> int:
        return sum(1 for i in self.instances.values() if i.state.provisioned)

    # ---- observing ---------------------------------------------------------------------------
    async def observe(self) -> None:
        now = self.clock()
        self._bill(now)
        live = [i for i in self.instances.values() if i.handle is not None and i.state is not S.STOPPING]
        runs = await asyncio.gather(*(self.provider.status(i.handle) for i in live))
        due = [(i, run) for i, run in zip(live, runs) if self._probe_due(i, now)]
        probes = await asyncio.gather(*(self._prober.ready(i.handle, run) for i, run in due))
        now = self.clock()
        for (inst, _), probe in zip(due, probes):
            inst.last_probe, inst.probed_at = probe, now
            self._judge(inst, probe, now)
        for inst, run in zip(live, runs):
            if inst.state in (S.READY, S.DRAINING):
                self._watch_serving(inst, run, now)
        self._watch_capacity(live, runs, now)  # reclaim notices, slow spot starts
        for inst in list(self.instances.values()):
            if inst.handle is None and inst.state is not S.STOPPING and \
                    now - inst.created > self.config.start_timeout_s:
                self._fail(inst, f"the provider gave no address within {self.config.start_timeout_s:g}s")
        await self._advance_drains(now)
        self._start_replacements(now)

    def _probe_due(self, inst: ManagedInstance, now: float) -> bool:
        if inst.state in (S.STARTING, S.WARMING):
            return True
        return inst.state is S.READY and (
            inst.probed_at is None or now - inst.probed_at >= self.config.ready_probe_interval_s)

    def _judge(self, inst: ManagedInstance, probe: Probe, now: float) -> None:
        if inst.id not in self.instances:
            return
        verdict = judge(inst.state, probe, now - inst.created, self.config.start_timeout_s)
        if verdict is None:
            return
        target, reason = verdict
        if target is S.FAILED:
            self._fail(inst, reason)
            return
        for state in path(inst.state, target):
            self._transition(inst, state, reason)
        if inst.state is S.READY:
            self._join_pool(inst, now)

    def _watch_serving(self, inst: ManagedInstance, run: RunStatus, now: float) -> None:
        if run.gone:
            self._fail(inst, f"{run.detail or run.state.value} while {inst.state.value}")
            return
        seen = self.pool.get(inst.id)
        if seen is None or seen.ready or inst.state is not S.READY:
            inst.unready_since = None
            return
        if inst.unready_since is None:
            inst.unready_since = now
        elif now - inst.unready_since > self.config.unready_grace_s:
            self._fail(inst, f"not answering /ready for {now - inst.unready_since:.0f}s")

    async def _advance_drains(self, now: float) -> None:
        draining = [i for i in self.instances.values() if i.state is S.DRAINING]
        if not draining:
            return
        loads = await asyncio.gather(*(self._prober.load(i.handle) for i in draining))
        for inst, report in zip(draining, loads):
            if inst.state is not S.DRAINING:
                continue  # revived, failed or stopping while we waited for the report
            inst.last_load = report or inst.last_load
            gateway = self._gateway_inflight(inst)
            engine = (report.num_running + report.num_waiting) if report is not None else None
            waited = now - (inst.drain_started or now)
            if gateway == 0 and engine == 0:
                self._begin_stop(inst, f"drained in {waited:.1f}s", in_flight=0)
            elif waited > self.config.drain_timeout_s:
                self._begin_stop(inst, f"drain timeout after {waited:.0f}s", in_flight=gateway,
                                 engine_in_flight=engine)

    def _gateway_inflight(self, inst: ManagedInstance) -> int:
        seen = self.pool.get(inst.id)
        return seen.inflight if seen is not None else 0

    # ---- deciding -----------------------------------------------------------------------------
    def signals(self, now: float) -> PoolSignals:
        loads = []
        for inst in self.instances.values():
            seen = self.pool.get(inst.id)
            if inst.state is S.READY and seen is not None and seen.report is not None:
                loads.append(seen.report)
        seen = self.pool.signals()
        return self.collector.snapshot(now, loads, seen.queue_depth, self.counts(), seen.inflight)

    def tick(self, now: float) -> None:
        """Decide and reconcile (synchronous: starts and stops run as tasks)."""
        ctx = self.signals(now)
        self.last_signals = ctx
        step = scaling_step(self.policy, self.policy_state, ctx, self.statuses(), self._active_override(now),
                            self._start_not_before, self.planner())
        self.policy_state = step.state
        wall = self.wall()
        self.desired = step.desired
        self.history.decision(wall, step.provisioned, step.desired, step.reason, step.source, step.policy_desired)
        self.history.sample(self._sample(wall, ctx, step.desired))
        if step.changes:
            if self.metrics is not None:
                direction = "up" if step.desired > step.provisioned else "down"
                self.metrics.decisions.labels(self.model, self.version, direction, step.source).inc()
            log.info("%s: %d -> %d (%s)", self.key, step.provisioned, step.desired, step.reason)
        if step.held_starts:
            log.info("%s: %d start(s) held by restart backoff for %.0fs", self.key, step.held_starts,
                     self._start_not_before - now)
        self.apply(step.plan, step.reason, now)

    def statuses(self) -> list[InstanceStatus]:
        """What reconciliation sees: instances not on their way out (stopping, or under
        a reclaim notice: its replacement is already on its way)."""
        return [InstanceStatus(i.id, i.state, self._gateway_inflight(i), i.since)
                for i in self.instances.values() if i.state is not S.STOPPING and i.reclaim_at is None]

    def planner(self) -> Planner:
        """Which instances to act on: by capacity class when spot is on."""
        return self._plan_mix if self.autoscale.capacity.spot_enabled else plan_scaling

    def apply(self, plan: ScalePlan, reason: str, now: float) -> None:
        for iid in plan.revive:
            inst = self.instances[iid]
            self._transition(inst, S.READY, f"revived: {reason}")
            inst.drain_started = None
            self.pool.set_draining(iid, False)
        for iid in plan.cancel:
            self._begin_stop(self.instances[iid], f"cancelled: {reason}")
        for iid in plan.drain:
            inst = self.instances[iid]
            self._transition(inst, S.DRAINING, reason)
            inst.drain_started = now
            self.pool.set_draining(iid, True)
        for c in (plan.start_classes or (ON_DEMAND,) * plan.start)[:plan.start]:
            self._launch(reason, now, capacity_class=c)

    def _active_override(self, now: float) -> Override | None:
        o = self.override
        if o is not None and not o.in_force(now):
            self.history.event(self.wall(), "-", "override", f"{o.instances}", "expired", o.reason)
            self.override = o = None
        return o

    def override_active(self) -> bool:
        return self._active_override(self.clock()) is not None

    def set_override(self, instances: int | None, duration_s: float | None, reason: str) -> Override | None:
        """Pin the instance count (``None`` clears it); counted as a manual intervention."""
        max_n = self.autoscale.bounds.max_instances
        if instances is not None and not 0 <= instances <= max_n:
            raise ValueError(f"instances must be in [0, {max_n}] (max_instances), got {instances}")
        if duration_s is not None and duration_s <= 0:
            raise ValueError(f"duration_s must be positive, got {duration_s}")
        wall = self.wall()
        if instances is None:
            old, self.override = self.override, None
            self.history.event(wall, "-", "override", str(old.instances) if old else None, "cleared", reason)
            action = "clear"
        else:
            until = None if duration_s is None else self.clock() + duration_s
            self.override = Override(instances, until, reason, wall)
            self.history.event(wall, "-", "override", None, str(instances), reason, duration_s=duration_s)
            action = "scale"
        if self.metrics is not None:
            self.metrics.manual.labels(self.model, self.version, action).inc()
        self._next_tick = None  # act on it at the next step, not a tick later
        return self.override
