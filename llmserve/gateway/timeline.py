"""One timeline per model: every pool of the model on one time axis.

A rollout is several things moving at once: each version's traffic weight, each
pool's instances by state, the canary analysis' stage and verdicts, the scaling
decisions and their reasons, and what people did by hand. Each has its owner (the
router, the pools, the canary analysis, the elastic controllers, the admin API);
this module only samples and gathers them, so one JSON document and one chart show
them together:

- ``samples``: the gateway's own view every ``interval_s``, per version: the weight,
  the pool's instances by the state its owner gave them (ready / not ready /
  starting / draining), requests in flight and queued;
- ``canary``: the analysis' status and events (stage changes and check verdicts),
  read through :class:`~llmserve.gateway.canary.CanaryAnalysis`'s public
  ``status()`` and ``events()``;
- per pool with an elastic controller (a :class:`PoolHistorySource`): its samples
  of instances by lifecycle state and desired count, its scaling decisions, its events;
- ``interventions``: admin actions on the gateway (canary actions, instances added,
  removed, drained) and the controllers' manual overrides.

Times are wall-clock seconds (``time.time()``), as in every history shown to people.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable


if TYPE_CHECKING:
    from llmserve.gateway.pool import Pool


class ModelRuntime(Protocol):
    """What the timeline reads of a served model (``runtime.ModelRuntime``)."""

    config: Any  # its ModelConfig: name, versions
    pools: dict[str, Pool]
    router: Any  # weights by version
    canary: Any  # CanaryAnalysis or None: status(), events()


@runtime_checkable
class PoolHistorySource(Protocol):
    """A gateway service that keeps one pool's history (the elastic controller)."""

    model: str
    version: str
    history: Any  # autoscale.history.History: window(since, limit) -> {"samples", "decisions", "events"}


@dataclass(frozen=True, slots=True)
class Intervention:
    time: float
    model: str
    version: str | None
    action: str  # canary_start | canary_promote | ... | instance_add | instance_remove | instance_drain
    reason: str


def pool_sample(rt: ModelRuntime) -> dict[str, dict[str, Any]]:
    """Each version's weight and pool right now, as the gateway sees them."""
    out = {}
    for version, pool in rt.pools.items():
        counts = {"ready": 0, "not_ready": 0, "starting": 0, "draining": 0}
        inflight = 0
        for i in pool.instances():
            inflight += i.inflight
            # The gateway keeps no lifecycle (the controller owns it): what routing knows.
            if not i.accepting:
                counts["draining"] += 1
            elif not i.has_been_ready:
                counts["starting"] += 1
            else:
                counts["ready" if i.ready else "not_ready"] += 1
        queued = sum(s.depth for s in pool.queue_stats().values())
        out[version] = {"weight": rt.router.weights[version], **counts, "inflight": inflight, "queued": queued}
    for version in rt.adapters:  # a LoRA version: its weight; its instances are its pool's
        out[version] = {"weight": rt.router.weights[version], "pool": rt.config.pool_of(version)}
    return out


class Timeline:
    """The gateway's samples and interventions for every model, in bounded buffers."""

    def __init__(self, interval_s: float = 1.0, max_samples: int = 3600, max_interventions: int = 1000) -> None:
        self.interval_s = interval_s
        self._samples: dict[str, deque[dict[str, Any]]] = {}
        self._interventions: deque[Intervention] = deque(maxlen=max_interventions)
        self._max_samples = max_samples

    def sample(self, models: Mapping[str, ModelRuntime], now: float) -> None:
        for name, rt in models.items():
            buf = self._samples.setdefault(name, deque(maxlen=self._max_samples))
            buf.append({"time": now, "versions": pool_sample(rt)})

    def intervention(self, now: float, model: str, version: str | None, action: str, reason: str) -> None:
        self._interventions.append(Intervention(now, model, version, action, reason))

    def of_model(self, rt: ModelRuntime, sources: Iterable[object], now: float, since: float = 0.0,
                 limit: int = 3600) -> dict[str, Any]:
        """The model's whole timeline newer than ``since`` (the newest ``limit`` samples)."""
        name = rt.config.name
        samples = [s for s in self._samples.get(name, ()) if s["time"] > since][-limit:]
        pools: dict[str, Any] = {}
        interventions = [asdict(i) for i in self._interventions if i.model == name and i.time > since]
        for src in sources:
            if isinstance(src, PoolHistorySource) and src.model == name and src.version in rt.pools:
                h = src.history.window(since, limit)
                pools[src.version] = h
                interventions += [{"time": e["time"], "model": name, "version": src.version, "action": "scale_override",
                                   "reason": f"{e['new']}: {e['reason']}"} for e in h["events"] if e["kind"] == "override"]
        canary = None
        if rt.canary is not None:
            canary = {"status": rt.canary.status(),
                      "events": [e for e in rt.canary.events() if e["timestamp"] > since]}
        return {"model": name, "time": now, "since": since, "interval_s": self.interval_s,
                "versions": [v.name for v in rt.config.versions], "samples": samples, "controllers": pools,
                "canary": canary, "interventions": sorted(interventions, key=lambda i: i["time"])}
