"""The simulator's side of the live executor: simulated instances started and stopped,
and the simulated gateway told what routing needs.

The :class:`~llmserve.autoscale.executor.Executor` that carries out the live
controller's effects carries out the simulator's: these two classes stand where
the live :class:`~llmserve.autoscale.provider_launcher.ProviderLauncher` and
:class:`~llmserve.autoscale.provider_launcher.PoolRouter` stand. A simulated start
is a cold start on the instance profile's schedule (events the simulator turns
into ``Advance`` effects); a simulated process exits at once when stopped.
"""

from __future__ import annotations

from collections.abc import Callable

from llmserve.autoscale.effects import Start
from llmserve.lifecycle import InstanceState
from llmserve.sim.gateway import SimGateway
from llmserve.sim.instance import SimInstance
from llmserve.sim.profile import InstanceProfile
from llmserve.sim.sharing import BusyInstances

S = InstanceState
Push = Callable[[float, InstanceState, SimInstance], None]  # (when, the state it reaches, instance)


class SimLauncher:
    def __init__(self, profile: InstanceProfile, cores: BusyInstances | None, reach: Push,
                 born: Callable[[SimInstance], None]) -> None:
        self.profile = profile
        self.cores = cores
        self.reach = reach  # schedules the cold start's steps
        self.born = born  # a new instance: the simulator draws its reclaim
        self.exited: Callable[[SimInstance, str, int | None], None] | None = None  # the executor's
        self.ready_at_once = False  # the run's first instances: ready at time 0, no cold start
        self.max_adapters: int | None = None  # adapters an instance keeps (SimAdapters.max_resident)

    def create(self, iid: int, now: float, start: Start) -> SimInstance:
        inst = SimInstance(iid, self.profile, now, S.STARTING, self.cores, self.max_adapters)
        inst.reason, inst.capacity_class, inst.replaces = start.reason, start.capacity_class, start.replaces
        return inst

    def launch(self, inst: SimInstance) -> None:
        self.born(inst)
        if not self.ready_at_once:
            p, now = self.profile, inst.created
            self.reach(now + p.cold_start_s - p.warmup_s, S.WARMING, inst)
            self.reach(now + p.cold_start_s, S.READY, inst)

    def stopping(self, inst: SimInstance) -> bool:
        return False  # a simulated stop is over at once

    def halt(self, inst: SimInstance, reason: str) -> None:
        if inst.in_flight:
            raise RuntimeError(f"instance {inst.id} stopped with {inst.in_flight} requests in flight")
        self.exited(inst, reason, 0)

    def release(self, inst: SimInstance, reason: str) -> None:
        pass  # simulated instances do not fail


class SimRouter:
    """The simulated gateway keeps only the instances that take new requests."""

    def __init__(self, gateway: SimGateway, clock: Callable[[], float]) -> None:
        self.gateway = gateway
        self.clock = clock

    def join(self, inst: SimInstance) -> str | None:
        self.gateway.add_instance(inst, self.clock())
        return None

    def leave(self, inst: SimInstance, reason: str) -> None:
        self.gateway.remove_instance(inst)

    def accepting(self, inst: SimInstance, accepting: bool) -> None:
        if accepting:
            self.gateway.add_instance(inst, self.clock())
        else:
            self.gateway.remove_instance(inst)

    def in_flight(self, inst: SimInstance) -> int:
        return inst.in_flight

    def served(self, inst: SimInstance) -> int:
        return 0  # not kept: no history in a simulated day

    def failed(self, why: str | None) -> None:
        pass  # simulated instances always get ready: a simulated pool never gives up
