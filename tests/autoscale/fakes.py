"""An in-memory instance provider and prober for controller tests: no processes, no HTTP.

A :class:`FakeEngine` is what a real engine reports about itself: its lifecycle
word (``starting``, ``warming``, ``ready``, ``failed``), what it has running, and
whether its process is gone. Tests move engines along by hand and step the
controller with a fake clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmserve.autoscale.config import AutoscaleConfig, BoundsConfig, StaticConfig
from llmserve.autoscale.controller import ControllerConfig, PoolController
from llmserve.autoscale.probe import Probe
from llmserve.autoscale.providers.base import InstanceHandle, InstanceSpec, RunState, RunStatus, SpotUnavailable
from llmserve.gateway.admission import ConcurrencyConfig
from llmserve.gateway.pool import Pool
from llmserve.lifecycle import InstanceState
from llmserve.load_report import LoadReport


@dataclass
class FakeEngine:
    instance_id: str
    state: str = "starting"
    running: int = 0
    waiting: int = 0
    exit_code: int | None = None  # set: the process is gone
    vanished: bool = False
    sigterm_with_running: int | None = None  # what was running when it was told to stop
    reclaim_at: float | None = None  # set: the provider has given a reclaim notice


@dataclass
class FakeProvider:
    name: str = "fake"
    initial_state: str = "starting"
    engines: dict[str, FakeEngine] = field(default_factory=dict)
    specs: list[InstanceSpec] = field(default_factory=list)
    stops: list[str] = field(default_factory=list)
    fail_start: bool = False
    refuse_spot: bool = False
    closed: bool = False
    url_template: str = "http://fake-{id}"

    async def start(self, spec: InstanceSpec) -> InstanceHandle:
        if self.fail_start:
            raise RuntimeError("no capacity")
        if self.refuse_spot and spec.capacity_class == "spot":
            raise SpotUnavailable("no spot capacity in this zone")
        self.specs.append(spec)
        self.engines[spec.instance_id] = FakeEngine(spec.instance_id, self.initial_state)
        return InstanceHandle(spec.instance_id, self.url_template.format(id=spec.instance_id), self.name)

    async def stop(self, handle: InstanceHandle, grace_s: float) -> int | None:
        e = self.engines[handle.instance_id]
        self.stops.append(handle.instance_id)
        if e.exit_code is None:
            e.sigterm_with_running = e.running + e.waiting
            e.exit_code = 0
        return e.exit_code

    async def status(self, handle: InstanceHandle) -> RunStatus:
        e = self.engines[handle.instance_id]
        if e.vanished:
            return RunStatus(RunState.VANISHED, detail="actor died")
        if e.exit_code is not None:
            return RunStatus(RunState.EXITED, e.exit_code, f"exited with code {e.exit_code}", reclaim_at=e.reclaim_at)
        return RunStatus(RunState.RUNNING, reclaim_at=e.reclaim_at)

    async def log_tail(self, handle: InstanceHandle, lines: int = 20) -> str:
        return ""

    async def close(self) -> None:
        self.closed = True


class FakeProber:
    def __init__(self, provider: FakeProvider) -> None:
        self.provider = provider

    async def ready(self, handle: InstanceHandle, run: RunStatus) -> Probe:
        e = self.provider.engines[handle.instance_id]
        if run.gone:
            return Probe(run)
        # What probe_ready does with the engine's word: read it into the enum once.
        return Probe(run, 200 if e.state == "ready" else 503, InstanceState.from_wire(e.state),
                     "boom" if e.state == "failed" else "")

    async def load(self, handle: InstanceHandle) -> LoadReport | None:
        e = self.provider.engines[handle.instance_id]
        if e.exit_code is not None:
            return None
        return LoadReport(instance_id=e.instance_id, model="m", ready=e.state == "ready", draining=False,
                          num_running=e.running, num_waiting=e.waiting, num_waiting_by_priority={},
                          kv_cache_usage=0.0, busy_fraction=0.0, tokens_per_s=0.0,
                          generation_tokens_per_s=0.0, max_num_seqs=8, prefix_cache_hit_rate=0.0,
                          timestamp=0.0)


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_controller(*, min_instances: int = 1, max_instances: int = 4, policy: str = "static",
                    static: int | None = None, initial_state: str = "starting", capacity=None, **lifecycle):
    """A controller over a real (in-memory) gateway Pool, a fake provider and a fake clock."""
    clock = Clock()
    provider = FakeProvider(initial_state=initial_state)
    pool = Pool("m/v1", concurrency=ConcurrencyConfig(fixed=4), clock=clock)
    n = min_instances if static is None else static
    auto = AutoscaleConfig(policy=policy, tick_s=1.0, static=StaticConfig(instances=n),
                           bounds=BoundsConfig(min_instances=min_instances, max_instances=max_instances,
                                               scale_up_cooldown_s=0.0, scale_down_window_s=0.0),
                          **({"capacity": capacity} if capacity is not None else {}))
    cfg = ControllerConfig(**{"start_timeout_s": 60.0, "drain_timeout_s": 30.0, "unready_grace_s": 5.0,
                              "restart_backoff_s": 4.0, **lifecycle})
    ctl = PoolController(pool, "m", "v1", auto, provider, lambda iid: InstanceSpec(iid, ("--threads", "1")),
                         cfg, prober=FakeProber(provider), clock=clock, wall=clock)
    return ctl, provider, pool, clock
