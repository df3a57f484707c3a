"""A tiny fluid model of a pool, to drive policies with synthetic demand in tests.

Each instance serves up to ``capacity`` tokens/s within the SLO and saturates at
``saturation`` tokens/s; demand above what the ready instances can serve piles up
in the gateway queue. Latency grows as utilisation approaches 1. Instances take
``cold_start`` seconds to become ready. Crude on purpose: the tests check a
policy's direction and timing, not queueing accuracy (the simulator does that).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from llmserve.autoscale.policy import ScalingPolicy
from llmserve.autoscale.signals import PoolSignals


@dataclass
class Plant:
    capacity: float = 1000.0
    saturation: float = 1300.0
    cold_start: float = 120.0
    tokens_per_request: float = 500.0
    base_ttft: float = 0.3
    ready: int = 1
    starting: list[float] = field(default_factory=list)  # ready-at times
    backlog: float = 0.0  # tokens queued at the gateway
    desired_log: list[tuple[float, int, str]] = field(default_factory=list)
    ready_log: list[tuple[float, int]] = field(default_factory=list)

    def signals(self, now: float, demand: float, dt: float) -> PoolSignals:
        self.ready += sum(1 for t in self.starting if t <= now)
        self.starting = [t for t in self.starting if t > now]
        n = max(self.ready, 1)
        served = min(demand + self.backlog / dt, n * self.saturation)
        self.backlog = max(0.0, self.backlog + (demand - served) * dt)
        rho = served / (n * self.capacity)
        ttft = self.base_ttft / max(1e-3, 1.0 - min(rho, 0.999)) * 0.5
        if self.backlog > 0:
            ttft += self.backlog / (n * self.saturation)
        queued = int(self.backlog / self.tokens_per_request)
        in_flight = served / self.tokens_per_request * 5.0
        return PoolSignals(
            now=now, window_s=dt, arrival_rate=demand / self.tokens_per_request,
            arrival_tokens_per_s=demand, queue_depth={"realtime": queued},
            running=int(in_flight), ttft_p50=ttft / 2, ttft_p99=ttft, e2e_p50=5.0, e2e_p99=10.0,
            busy_fraction=1.0 if served > 0 else 0.0, kv_usage=min(1.0, rho * 0.7),
            batch_fill=min(1.0, rho * 0.7), throughput_per_instance=served / n,
            ready=self.ready, starting=len(self.starting),
        )

    def apply(self, now: float, desired: int) -> None:
        provisioned = self.ready + len(self.starting)
        if desired > provisioned:
            self.starting += [now + self.cold_start] * (desired - provisioned)
        elif desired < provisioned:
            excess = provisioned - desired
            cancel = min(excess, len(self.starting))
            self.starting = sorted(self.starting)[: len(self.starting) - cancel]
            self.ready -= excess - cancel


def run(policy: ScalingPolicy, demand: Callable[[float], float], duration: float, dt: float = 2.0,
        plant: Plant | None = None) -> Plant:
    """Tick ``policy`` against ``plant`` for ``duration`` seconds of demand(t) tokens/s."""
    plant = plant or Plant()
    state = policy.initial_state()
    t = 0.0
    while t < duration:
        t += dt
        ctx = plant.signals(t, demand(t), dt)
        d = policy.decide(ctx, state)
        state = d.state
        plant.desired_log.append((t, d.desired, d.reason))
        plant.apply(t, d.desired)
        plant.ready_log.append((t, plant.ready))
    return plant


def ready_at(plant: Plant, t: float) -> int:
    """Ready instances at the last tick at or before ``t``."""
    n = plant.ready_log[0][1]
    for when, ready in plant.ready_log:
        if when > t:
            break
        n = ready
    return n
