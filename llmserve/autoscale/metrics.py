"""The elastic controller's Prometheus metrics, all under ``llmserve:autoscale_``.

Registered into the gateway's own registry, so one ``/metrics`` scrape of the
gateway shows traffic and scaling side by side. Gauges are read from the live
controllers at scrape time; counters are bumped where things happen.
``manual_interventions_total`` is the number that should fall over time: each
one is an operator overriding the policy.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from llmserve.autoscale.capacity_classes import CLASSES
from llmserve.autoscale.signals import PoolSignals
from llmserve.lifecycle import ALLOWED, InstanceState


class Exported(Protocol):
    """What the gauges read of a pool's controller (``controller.PoolController`` is one)."""

    model: str
    version: str
    desired: int
    last_signals: PoolSignals | None

    def counts(self) -> dict[InstanceState, int]: ...
    def override_active(self) -> bool: ...
    def gave_up_starting(self) -> bool: ...
    def class_counts(self) -> dict[str, int]: ...


P = "llmserve:autoscale_"
_COLD_START_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class AutoscaleMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["model", "version"]
        self.transitions = Counter(f"{P}transitions", "Instance lifecycle transitions",
                                   labels + ["from_state", "to_state"], registry=registry)
        self.decisions = Counter(f"{P}scaling_decisions", "Decisions that changed the instance count",
                                 labels + ["direction", "source"], registry=registry)
        self.manual = Counter(f"{P}manual_interventions", "Operator overrides of the scaling policy",
                              labels + ["action"], registry=registry)
        self.replacements = Counter(f"{P}replacements", "Instances started to replace a failed one",
                                    labels, registry=registry)
        self.instance_seconds = Counter(f"{P}instance_seconds", "Instance-seconds held (any state but "
                                        "stopped or failed): the cost", labels, registry=registry)
        self.cost = Counter(f"{P}instance_cost_dollars", "Money spent on instances held, at each capacity "
                            "class's price per instance-hour", labels + ["capacity_class"], registry=registry)
        self.reclaims = Counter(f"{P}reclaims", "Reclaim notices (the provider takes the instance)",
                                labels + ["capacity_class"], registry=registry)
        self.spot_fallbacks = Counter(f"{P}spot_fallbacks", "Starts moved from spot to on-demand (spot refused, "
                                      "or slow to start)", labels + ["reason"], registry=registry)
        self.cold_start = Histogram(f"{P}cold_start_seconds", "Start requested to /ready 200", labels,
                                    buckets=_COLD_START_BUCKETS, registry=registry)
        self.drain = Histogram(f"{P}drain_seconds", "Drain started to the instance stopped", labels,
                               buckets=_COLD_START_BUCKETS, registry=registry)
        self._controllers: list[Exported] = []
        registry.register(_Gauges(self._controllers))

    def attach(self, controller: Exported) -> None:
        """Export the controller's gauges, and every counter at 0 from the start (so a
        dashboard shows 0, not "no data", and ``rate()`` sees the first increment)."""
        self._controllers.append(controller)
        key = (controller.model, controller.version)
        for old, targets in ALLOWED.items():
            for new in targets:
                self.transitions.labels(*key, old.value, new.value)
        for direction in ("up", "down"):
            for source in ("policy", "manual"):
                self.decisions.labels(*key, direction, source)
        for action in ("scale", "clear"):
            self.manual.labels(*key, action)
        for metric in (self.replacements, self.instance_seconds, self.cold_start, self.drain):
            metric.labels(*key)
        for c in CLASSES:
            self.cost.labels(*key, c)
            self.reclaims.labels(*key, c)
        for reason in ("refused", "slow"):
            self.spot_fallbacks.labels(*key, reason)


class _Gauges(Collector):
    def __init__(self, controllers: list[Exported]) -> None:
        self._controllers = controllers

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []

    def collect(self) -> Iterable[GaugeMetricFamily]:
        labels = ["model", "version"]
        instances = GaugeMetricFamily(f"{P}instances", "Instances by lifecycle state",
                                      labels=labels + ["state"])
        desired = GaugeMetricFamily(f"{P}desired_instances", "The last decision's instance count",
                                    labels=labels)
        arrival = GaugeMetricFamily(f"{P}arrival_rate", "Requests per second arriving at the pool",
                                    labels=labels)
        override = GaugeMetricFamily(f"{P}override_active", "1 while a manual override is in force",
                                     labels=labels)
        failed = GaugeMetricFamily(f"{P}pool_failed", "1 while the pool has given up starting instances "
                                   "(max_start_failures in a row; POST /admin/autoscale/retry)", labels=labels)
        by_class = GaugeMetricFamily(f"{P}class_instances", "Instances held (billed) by capacity class",
                                     labels=labels + ["capacity_class"])
        for c in self._controllers:
            key = [c.model, c.version]
            counts = c.counts()
            for state in InstanceState:
                if state.billed:
                    instances.add_metric(key + [state.value], counts.get(state, 0))
            desired.add_metric(key, c.desired)
            arrival.add_metric(key, c.last_signals.arrival_rate if c.last_signals else 0.0)
            override.add_metric(key, 1.0 if c.override_active() else 0.0)
            failed.add_metric(key, 1.0 if c.gave_up_starting() else 0.0)
            for cls, n in c.class_counts().items():
                by_class.add_metric(key + [cls], n)
        return [instances, desired, arrival, override, failed, by_class]
