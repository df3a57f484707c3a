"""What a pool controller shows: admin API rows, history samples. Plain functions
of the records they are given, and :class:`PoolViews`, the controller's methods
that assemble its views from them."""

from __future__ import annotations

from typing import Any

from llmserve.autoscale.config import AutoscaleConfig
from llmserve.autoscale.managed import ManagedInstance
from llmserve.autoscale.scaling_step import Override
from llmserve.autoscale.signals import PoolSignals
from llmserve.autoscale.start_failures import GaveUp
from llmserve.gateway.pool import Upstream
from llmserve.lifecycle import InstanceState


def sample(wall: float, ctx: PoolSignals, desired: int) -> dict[str, Any]:
    return {"time": wall, "ready": ctx.ready, "warming": ctx.warming, "starting": ctx.starting,
            "draining": ctx.draining, "desired": desired, "arrival_rate": ctx.arrival_rate,
            "arrival_tokens_per_s": ctx.arrival_tokens_per_s, "queue_depth": dict(ctx.queue_depth),
            "queued": ctx.queued, "running": ctx.running, "waiting": ctx.waiting,
            "ttft_p50": ctx.ttft_p50, "ttft_p99": ctx.ttft_p99, "e2e_p50": ctx.e2e_p50,
            "e2e_p99": ctx.e2e_p99, "busy_fraction": ctx.busy_fraction, "kv_usage": ctx.kv_usage,
            "batch_fill": ctx.batch_fill}


def describe_instance(inst: ManagedInstance, seen: Upstream | None, now: float) -> dict[str, Any]:
    """One instance as the controller knows it (``seen``: the gateway pool's routing record)."""
    report = seen.report if seen is not None and seen.report is not None else inst.last_load
    return {
        "instance_id": inst.id, "state": inst.state.value,
        "url": inst.handle.url if inst.handle else None, "in_pool": inst.in_pool,
        "age_s": now - inst.created, "in_state_s": now - inst.since, "reason": inst.reason,
        "created": inst.created_wall, "replaces": inst.replaces, "exit_code": inst.exit_code,
        "capacity_class": inst.capacity_class, "reclaim_at": inst.reclaim_at,
        "cold_start_s": (inst.ready_at - inst.created) if inst.ready_at is not None else None,
        "inflight": seen.inflight if seen is not None else 0,
        "served": seen.served if seen is not None else inst.served,
        "gateway_ready": seen.ready if seen is not None else None,
        "load": None if report is None else {
            "running": report.num_running, "waiting": report.num_waiting,
            "kv_cache_usage": report.kv_cache_usage, "busy_fraction": report.busy_fraction,
            "tokens_per_s": report.tokens_per_s, "max_num_seqs": report.max_num_seqs},
    }


def describe_pool(key: str, model: str, version: str, autoscale: AutoscaleConfig, provider: str, desired: int,
                  counts: dict[InstanceState, int], class_counts: dict[str, int], cost_dollars: dict[str, float],
                  override: Override | None, now: float, last_decision: dict[str, Any] | None,
                  failed: GaveUp | None = None) -> dict[str, Any]:
    """A pool's admin row: its settings, counts, cost, override, and why it gave up starting
    instances (``failed``, None while it has not)."""
    b, o = autoscale.bounds, override
    return {
        "pool": key, "model": model, "version": version, "policy": autoscale.policy,
        "provider": provider, "tick_s": autoscale.tick_s,
        "min_instances": b.min_instances, "max_instances": b.max_instances,
        "desired": desired, "provisioned": sum(n for s, n in counts.items() if s.provisioned),
        "counts": {s.value: n for s, n in counts.items() if s.billed},
        "class_counts": class_counts, "cost_dollars": dict(cost_dollars),
        "prices_per_hour": {c: autoscale.capacity.price(c) for c in cost_dollars},
        "override": None if o is None else {
            "instances": o.instances, "reason": o.reason, "set_at": o.set_wall,
            "remaining_s": None if o.until is None else max(0.0, o.until - now)},
        "last_decision": last_decision,
        "failed": None if failed is None else failed.view(key),
    }


class PoolViews:
    """The views of a :class:`~llmserve.autoscale.controller.PoolController` (its mixin)."""

    def describe_instance(self, inst: ManagedInstance, now: float) -> dict[str, Any]:
        return describe_instance(inst, self.pool.get(inst.id), now)

    def describe(self) -> dict[str, Any]:
        now = self.clock()
        return describe_pool(self.key, self.model, self.version, self.autoscale, self.provider.name, self.desired,
                             self.counts(), self.class_counts(), self.cost_dollars, self._active_override(now),
                             now, (self.history.decisions(limit=1) or [None])[0], self.executor.gave_up)

    def gave_up_starting(self) -> bool:
        """Whether the pool stopped starting instances (``lifecycle.max_start_failures``)."""
        return self.executor.gave_up is not None

    def instance_views(self, include_finished: bool = True) -> list[dict[str, Any]]:
        now = self.clock()
        out = [self.describe_instance(i, now) for i in self.book]
        if include_finished:
            out += [self.describe_instance(i, now) for i in reversed(self.book.finished)]
        return out

    def dashboard(self) -> dict[str, Any]:
        """Everything the dashboard shows of this pool, in one JSON-able dict."""
        return {**self.describe(), "instances": self.instance_views(),
                "timeline": self.history.samples(limit=600),
                "events": self.history.events(limit=60),
                "decisions": self.history.decisions(limit=30, changes_only=True)}
