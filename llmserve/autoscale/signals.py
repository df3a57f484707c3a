"""What a scaling policy sees of a pool at one controller tick.

A policy is a pure function of these numbers and its own state, so the same
values can come from the live gateway (load reports, its own latency records) or
from the capacity simulator. Rates and percentiles cover a recent window ending
at ``now``; ``None`` means "no sample in the window", which is different from zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class PoolSignals:
    """One tick's view of a pool; the only input a policy gets besides its state."""

    now: float
    window_s: float = 10.0
    # Demand seen at the gateway.
    arrival_rate: float = 0.0
    arrival_tokens_per_s: float = 0.0
    # The batch class's part of those two, and the tokens/s its completion windows
    # require (remaining lines / time left, from the batch pace rule): a policy sizes
    # for realtime demand plus only that need, and leaves the rest to idle capacity.
    batch_arrival_rate: float = 0.0
    batch_arrival_tokens_per_s: float = 0.0
    batch_need_tokens_per_s: float = 0.0
    # Batch-class requests the gateway has sent to instances and not seen finish.
    batch_dispatched: int = 0
    queue_depth: dict[str, int] = field(default_factory=dict)
    # Summed over ready instances' load reports.
    waiting: int = 0
    running: int = 0
    # Requests the gateway has sent to instances and not seen finish: exact and
    # current, where the reports' waiting + running lag a report interval behind.
    dispatched: int = 0
    # Latency observed at the gateway over the window (seconds).
    ttft_p50: float | None = None
    ttft_p99: float | None = None
    e2e_p50: float | None = None
    e2e_p99: float | None = None
    # Means over ready instances.
    busy_fraction: float = 0.0
    kv_usage: float = 0.0
    batch_fill: float = 0.0
    seats_per_instance: float = 0.0  # max_num_seqs, from the reports received
    throughput_per_instance: float = 0.0
    # Tokens/s one instance sustains at a full batch, from the step models the ready
    # instances report and the pool's mean request shape; 0: none reported.
    modelled_capacity: float = 0.0
    # The same per thread count the reporting instances run on: ((threads, tokens/s), ...),
    # what :mod:`llmserve.autoscale.shared_cores` compares splits of a machine's cores with.
    modelled_by_threads: tuple[tuple[int, float], ...] = ()
    # Instances by lifecycle state.
    ready: int = 0
    warming: int = 0
    starting: int = 0
    draining: int = 0

    def __post_init__(self) -> None:
        for name in ("window_s", "arrival_rate", "arrival_tokens_per_s", "throughput_per_instance",
                     "modelled_capacity", "batch_arrival_rate", "batch_arrival_tokens_per_s",
                     "batch_need_tokens_per_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"pool signals: {name} must be >= 0, got {getattr(self, name)}")
        for name in ("waiting", "running", "dispatched", "batch_dispatched", "ready", "warming", "starting", "draining"):
            if getattr(self, name) < 0:
                raise ValueError(f"pool signals: {name} must be >= 0, got {getattr(self, name)}")

    @property
    def queued(self) -> int:
        """Requests held at the gateway, all classes."""
        return sum(self.queue_depth.values())

    @property
    def realtime_queued(self) -> int:
        """Requests held at the gateway, batch class left out."""
        return self.queued - self.queue_depth.get("batch", 0)

    @property
    def realtime_tokens_per_s(self) -> float:
        """Arrival tokens per second, batch class left out."""
        return self.arrival_tokens_per_s - self.batch_arrival_tokens_per_s

    @property
    def realtime_in_flight(self) -> int:
        """``in_flight`` without the batch class's requests (queued or dispatched)."""
        return max(self.in_flight - self.queue_depth.get("batch", 0) - self.batch_dispatched, 0)

    @property
    def realtime_share(self) -> float:
        """The realtime part of the requests in the engines (1.0 with no batch in them)."""
        if self.batch_dispatched <= 0:
            return 1.0
        engines = max(self.waiting + self.running, self.dispatched)
        return max(engines - self.batch_dispatched, 0) / engines if engines > 0 else 1.0

    @property
    def coming(self) -> int:
        """Instances that will take traffic without any new decision."""
        return self.warming + self.starting

    @property
    def provisioned(self) -> int:
        """Ready plus coming: the count a desired number is compared against."""
        return self.ready + self.warming + self.starting

    @property
    def in_flight(self) -> int:
        """Requests in the pool: queued at the gateway, waiting or running in engines
        (the gateway's own count where it is higher: reports are a poll old)."""
        return self.queued + max(self.waiting + self.running, self.dispatched)

    def utilisation(self, metric: str) -> float:
        """The mean utilisation signal named by ``metric`` (``busy``, ``kv`` or ``batch``)."""
        if metric == "busy":
            return self.busy_fraction
        if metric == "kv":
            return self.kv_usage
        if metric == "batch":
            return self.batch_fill
        raise ValueError(f"unknown utilisation metric {metric!r}")

    def latency_over(self, ttft_target: float, e2e_target: float | None = None) -> float:
        """How far p99 latency is over target, as a ratio (<= 1 means within target)."""
        ratio = 0.0
        if self.ttft_p99 is not None:
            ratio = self.ttft_p99 / ttft_target
        if e2e_target is not None and self.e2e_p99 is not None:
            ratio = max(ratio, self.e2e_p99 / e2e_target)
        return ratio
