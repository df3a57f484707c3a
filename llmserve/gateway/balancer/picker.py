"""The picker: filter, score, then power of two choices among the best.

Filter: routable (ready, healthy, not draining, breaker lets a request through)
and has room (below its concurrency target); a request on a LoRA adapter then
only where it is resident or loaded, if anywhere (``adapter.py``). Score: the weighted mean of the
configured scorers, in [0, 1]. Pick: of the candidates within ``tie_margin`` of
the best score, draw two at random and take the better (lower load on a tie).
Randomising only among near-equals keeps a strong signal (prefix affinity, an
idle instance) decisive, while several gateways working from the same slightly
stale reports do not all herd onto the one instance that looked best.

A large pool (more than ``score_all_up_to`` instances) is sampled: each round
draws ``sample_size`` instances at random and filters and scores only those
(power of d choices, as Envoy's least-request balancer and NGINX's ``random
two`` do), so a pick costs the same at 500 instances as at 8. The instances
holding the request's prefix join the draw, so affinity still finds its owner.
A draw with no room falls back to the whole pool: a request never waits while
some instance has room.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, field_validator

from llmserve.gateway.admission import ConcurrencyConfig, RoomLimits
from llmserve.gateway.balancer.adapter import place
from llmserve.gateway.balancer.base import RouteRequest, Scorer, StatelessScorer
from llmserve.gateway.balancer.busy import BusyScorer
from llmserve.gateway.balancer.columns import ColumnScorer, compiled_score
from llmserve.gateway.balancer.combine import weighted_mean
from llmserve.gateway.balancer.kv import KVScorer
from llmserve.gateway.balancer.prefix import PrefixAffinityScorer, PrefixConfig
from llmserve.gateway.balancer.queue import QueueScorer
from llmserve.gateway.balancer.running import RunningScorer
from llmserve.gateway.instance import InstanceView

SCORERS: dict[str, type] = {
    cls.name: cls for cls in (QueueScorer, RunningScorer, KVScorer, BusyScorer,
                              PrefixAffinityScorer)
}


class BalancerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    weights: dict[str, float] = Field(default_factory=lambda: {
        "queue": 1.0, "running": 1.0, "kv": 0.5, "busy": 0.5, "prefix": 2.0})
    prefix: PrefixConfig = PrefixConfig()
    tie_margin: float = Field(0.05, ge=0.0, le=1.0)
    # Pools up to this size: every instance is scored (the best is exact); larger ones are sampled.
    score_all_up_to: int = Field(32, ge=1)
    sample_size: int = Field(4, ge=2)  # instances drawn per round in a larger pool

    @field_validator("weights")
    @classmethod
    def _known(cls, weights: dict[str, float]) -> dict[str, float]:
        unknown = set(weights) - set(SCORERS)
        if unknown:
            raise ValueError(f"unknown scorers {sorted(unknown)}; known: {sorted(SCORERS)}")
        if any(w < 0 for w in weights.values()):
            raise ValueError("scorer weights must be non-negative")
        if not any(w > 0 for w in weights.values()):
            raise ValueError("at least one scorer needs a positive weight")
        return weights


def make_scorers(config: BalancerConfig) -> list[tuple[Scorer, float]]:
    out: list[tuple[Scorer, float]] = []
    for name, weight in config.weights.items():
        if weight <= 0:
            continue
        scorer = PrefixAffinityScorer(config.prefix) if name == "prefix" else SCORERS[name]()
        out.append((scorer, weight))
    return out


class NoPick(enum.Enum):
    NO_INSTANCES = "no instances in the pool"
    NONE_ROUTABLE = "no instance is ready and healthy"
    NO_ROOM = "every instance is at its concurrency target"


@dataclass(frozen=True, slots=True)
class PickResult:
    instance: InstanceView | None
    why_not: NoPick | None = None
    scores: dict[str, float] = field(default_factory=dict)


class Picker:
    def __init__(self, config: BalancerConfig | None = None,
                 concurrency: ConcurrencyConfig | None = None,
                 rng: random.Random | None = None) -> None:
        self.config = config or BalancerConfig()
        self.concurrency = concurrency or ConcurrencyConfig()
        self.scorers = make_scorers(self.config)
        self._rng = rng or random.Random()
        # Read per pick: kept as plain numbers (a pydantic field costs ~10x to read).
        c = self.config
        self._all_up_to, self._sample_size, self._tie_margin = c.score_all_up_to, c.sample_size, c.tie_margin
        self._limits = RoomLimits(self.concurrency), RoomLimits(self.concurrency, batch=True)
        self._prefix = self.scorer("prefix")
        self._told = [s for s, _ in self.scorers if not isinstance(s, StatelessScorer)]  # on_picked does something
        self._weights = tuple(w for _, w in self.scorers)
        self._total_w = sum(w for _, w in self.scorers)
        # per scorer, its declared column (attribute, rule), or None: it computes its own
        self._declared = [(s.attribute, int(s.rule)) if isinstance(s, ColumnScorer) else None
                          for s, _ in self.scorers]
        self._static_spec = tuple(self._declared) if all(d is not None for d in self._declared) else None

    def scorer(self, name: str) -> Scorer | None:
        return next((s for s, _ in self.scorers if s.name == name), None)

    def candidates(self, instances: Iterable[InstanceView], exclude: Iterable[str] = (), *,
                   batch: bool = False, sample: bool = True) -> tuple[list[InstanceView], NoPick | None]:
        """Those that may take a request (``batch``: room beyond the realtime reserve); of a
        large pool, those of a random draw that have room (``sample`` False: of all)."""
        limit = self._limits[batch]
        pool = instances if isinstance(instances, list) else list(instances)
        if sample and len(pool) > self._all_up_to and not exclude:
            drawn = self._rng.sample(pool, min(self._sample_size, len(pool)))
            roomy = [i for i in drawn if i.routable and i.est_load < limit[i.seats]]
            if roomy:
                return roomy, None
        if exclude:
            excluded = set(exclude)
            pool = [i for i in pool if i.instance_id not in excluded]
        if not pool:
            return [], NoPick.NO_INSTANCES
        roomy = [i for i in pool if i.routable and i.est_load < limit[i.seats]]
        if roomy:
            return roomy, None
        return [], (NoPick.NO_ROOM if any(i.routable for i in pool) else NoPick.NONE_ROUTABLE)

    def has_room(self, instances: Iterable[InstanceView]) -> bool:
        return bool(self.candidates(instances)[0])

    def with_affinity(self, request: RouteRequest, candidates: list[InstanceView],
                      pool: Sequence[InstanceView], batch: bool = False) -> list[InstanceView]:
        """A sampled ``candidates`` plus the instances of ``pool`` holding the request's prefix
        (routable, with room); the candidates themselves when there are none."""
        prefix = self._prefix
        if prefix is None or len(pool) <= self._all_up_to:
            return candidates
        owners = set(prefix.matched_blocks(request)[0])  # type: ignore[attr-defined]
        if not owners:
            return candidates
        limit, have = self._limits[batch], {c.instance_id for c in candidates}
        extra = [i for i in pool if i.instance_id in owners and i.instance_id not in have
                 and i.routable and i.est_load < limit[i.seats]]
        return candidates + extra if extra else candidates

    def score(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> list[float]:
        n = len(candidates)
        if not self.scorers:
            return [0.0] * n
        cands = candidates if isinstance(candidates, list) else list(candidates)
        spec = self._static_spec
        if spec is None:  # a stateful scorer's column computed here, the declared ones compiled
            spec = tuple(d if d is not None else self._column(s, request, cands)
                         for (s, _), d in zip(self.scorers, self._declared))
        out = compiled_score(cands, spec, self._weights, self._total_w)
        if out is None:  # not compiled, or a value it does not take: the Python path
            columns = [s.score(request, cands) if d is not None else c
                       for (s, _), d, c in zip(self.scorers, self._declared, spec)]
            out = weighted_mean(columns, self._weights, self._total_w)
        return out

    @staticmethod
    def _column(scorer: Scorer, request: RouteRequest, cands: list[InstanceView]) -> list[float]:
        values = scorer.score(request, cands)
        if len(values) != len(cands):
            raise ValueError(f"scorer {scorer.name} gave {len(values)} scores for {len(cands)} candidates")
        return values if isinstance(values, list) else list(values)

    def pick(self, request: RouteRequest, instances: Iterable[InstanceView],
             exclude: Iterable[str] = ()) -> PickResult:
        """Choose an instance for the request (tell the scorers), or say why none."""
        pool = instances if isinstance(instances, list) else list(instances)
        # An adapter's request sees the whole pool: residency decides before any draw, or a
        # draw without the adapter's holders would load it on one more instance.
        cands, why_not = self.candidates(pool, exclude, sample=request.adapter is None)
        if not cands:
            return PickResult(None, why_not)
        cands = place(request.adapter, self.with_affinity(request, cands, pool)).candidates
        chosen, scores = self._choose(request, cands)
        by_id = {c.instance_id: s for s, c in zip(scores, cands)} if scores is not None else {}
        return PickResult(chosen, None, by_id)

    def choose(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> InstanceView:
        """Of ``candidates`` (non-empty, from :meth:`candidates`), the one for the request
        (the scorers are told). For a caller that filtered already: nothing is filtered again."""
        return self._choose(request, place(request.adapter, candidates).candidates)[0]

    def _choose(self, request: RouteRequest,
                cands: Sequence[InstanceView]) -> tuple[InstanceView, list[float] | None]:
        if len(cands) == 1:  # nothing to compare (one instance has room): skip scoring
            chosen, scores = cands[0], None
        else:
            scores = self.score(request, cands)
            cut = max(scores) - self._tie_margin
            near = [(s, c) for s, c in zip(scores, cands) if s >= cut]
            if len(near) >= 2:
                a, b = self._rng.sample(near, 2)  # the better; on a tie the less loaded, then a
                chosen = b[1] if (b[0], -b[1].est_load) > (a[0], -a[1].est_load) else a[1]
            else:
                chosen = near[0][1]
        for scorer in self._told:
            scorer.on_picked(request, chosen)
        return chosen, scores
