"""What a pool controller shows: admin API rows, the dashboard's pool, history samples.
Read-only over :class:`PoolController`'s state."""

from __future__ import annotations

from typing import Any

from llmserve.autoscale.managed import ManagedInstance
from llmserve.autoscale.signals import PoolSignals


class ControllerViews:
    """The JSON views of :class:`~llmserve.autoscale.controller.PoolController`."""

    def _sample(self, wall: float, ctx: PoolSignals, desired: int) -> dict[str, Any]:
        return {"time": wall, "ready": ctx.ready, "warming": ctx.warming, "starting": ctx.starting,
                "draining": ctx.draining, "desired": desired, "arrival_rate": ctx.arrival_rate,
                "arrival_tokens_per_s": ctx.arrival_tokens_per_s, "queue_depth": dict(ctx.queue_depth),
                "queued": ctx.queued, "running": ctx.running, "waiting": ctx.waiting,
                "ttft_p50": ctx.ttft_p50, "ttft_p99": ctx.ttft_p99, "e2e_p50": ctx.e2e_p50,
                "e2e_p99": ctx.e2e_p99, "busy_fraction": ctx.busy_fraction, "kv_usage": ctx.kv_usage,
                "batch_fill": ctx.batch_fill}

    def describe_instance(self, inst: ManagedInstance, now: float) -> dict[str, Any]:
        seen = self.pool.get(inst.id)
        report = seen.report if seen is not None and seen.report is not None else inst.last_load
        return {
            "instance_id": inst.id, "state": inst.state.value,
            "url": inst.handle.url if inst.handle else None, "in_pool": inst.in_pool,
            "age_s": now - inst.created, "in_state_s": now - inst.since, "reason": inst.reason,
            "created": inst.created_wall, "replaces": inst.replaces, "exit_code": inst.exit_code,
            "capacity_class": inst.capacity_class, "reclaim_at": inst.reclaim_at,
            "cold_start_s": (inst.ready_at - inst.created) if inst.ready_at is not None else None,
            "inflight": seen.inflight if seen is not None else 0,
            "served": seen.served if seen is not None else 0,
            "gateway_ready": seen.ready if seen is not None else None,
            "load": None if report is None else {
                "running": report.num_running, "waiting": report.num_waiting,
                "kv_cache_usage": report.kv_cache_usage, "busy_fraction": report.busy_fraction,
                "tokens_per_s": report.tokens_per_s, "max_num_seqs": report.max_num_seqs},
        }

    def describe(self) -> dict[str, Any]:
        now = self.clock()
        o = self._active_override(now)
        b = self.autoscale.bounds
        return {
            "pool": self.key, "model": self.model, "version": self.version, "policy": self.autoscale.policy,
            "provider": self.provider.name, "tick_s": self.autoscale.tick_s,
            "min_instances": b.min_instances, "max_instances": b.max_instances,
            "desired": self.desired, "provisioned": self.provisioned(),
            "counts": {s.value: n for s, n in self.counts().items() if s.billed},
            "class_counts": self.class_counts(), "cost_dollars": dict(self.cost_dollars),
            "prices_per_hour": {c: self.autoscale.capacity.price(c) for c in self.cost_dollars},
            "override": None if o is None else {
                "instances": o.instances, "reason": o.reason, "set_at": o.set_wall,
                "remaining_s": None if o.until is None else max(0.0, o.until - now)},
            "last_decision": (self.history.decisions(limit=1) or [None])[0],
        }

    def instance_views(self, include_finished: bool = True) -> list[dict[str, Any]]:
        now = self.clock()
        out = [self.describe_instance(i, now) for i in self.instances.values()]
        if include_finished:
            out += [self.describe_instance(i, now) for i in reversed(self.finished)]
        return out

    def pool_history(self, since: float, limit: int) -> dict[str, list[dict[str, Any]]]:
        """This pool on the model's timeline (``gateway/timeline.py``): instances by state and
        desired count per tick, scaling decisions that changed the count, events."""
        return {"samples": [{k: s[k] for k in ("time", "ready", "warming", "starting", "draining", "desired")}
                            for s in self.history.samples(since, limit)],
                "decisions": [d for d in self.history.decisions(limit=limit, changes_only=True) if d["time"] > since],
                "events": [e for e in self.history.events(limit=limit) if e["time"] > since]}

    def dashboard(self) -> dict[str, Any]:
        """Everything the dashboard shows of this pool, in one JSON-able dict."""
        return {**self.describe(), "instances": self.instance_views(),
                "timeline": self.history.samples(limit=600),
                "events": self.history.events(limit=60),
                "decisions": self.history.decisions(limit=30, changes_only=True)}
