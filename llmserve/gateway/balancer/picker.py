"""The picker: filter, score, then power of two choices among the best.

Filter: routable (ready, healthy, not draining, breaker lets a request through)
and has room (below its concurrency target); a request on a LoRA adapter then
only where it is resident or loaded, if anywhere (``adapter.py``). Score: the weighted mean of the
configured scorers, in [0, 1]. Pick: of the candidates within ``tie_margin`` of
the best score, draw two at random and take the better (lower load on a tie).
Randomising only among near-equals keeps a strong signal (prefix affinity, an
idle instance) decisive, while several gateways working from the same slightly
stale reports do not all herd onto the one instance that looked best.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, field_validator

from llmserve.gateway.admission import ConcurrencyConfig, has_room
from llmserve.gateway.balancer.adapter import place
from llmserve.gateway.balancer.base import RouteRequest, Scorer
from llmserve.gateway.balancer.busy import BusyScorer
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

    def scorer(self, name: str) -> Scorer | None:
        return next((s for s, _ in self.scorers if s.name == name), None)

    def candidates(self, instances: Iterable[InstanceView],
                   exclude: Iterable[str] = ()) -> tuple[list[InstanceView], NoPick | None]:
        excluded = set(exclude)
        pool = [i for i in instances if i.instance_id not in excluded]
        if not pool:
            return [], NoPick.NO_INSTANCES
        routable = [i for i in pool if i.routable]
        if not routable:
            return [], NoPick.NONE_ROUTABLE
        roomy = [i for i in routable if has_room(i, self.concurrency)]
        return roomy, (None if roomy else NoPick.NO_ROOM)

    def has_room(self, instances: Iterable[InstanceView]) -> bool:
        return bool(self.candidates(instances)[0])

    def score(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> list[float]:
        total_w = sum(w for _, w in self.scorers)
        combined = [0.0] * len(candidates)
        for scorer, w in self.scorers:
            # min(1, max(0, s)) written out (NaN -> 0 as there): one pick per request, so it is hot.
            combined = [c + w * (s if 0.0 < s < 1.0 else (1.0 if s >= 1.0 else 0.0))
                        for c, s in zip(combined, scorer.score(request, candidates), strict=True)]
        return [c / total_w for c in combined]

    def pick(self, request: RouteRequest, instances: Iterable[InstanceView],
             exclude: Iterable[str] = ()) -> PickResult:
        """Choose an instance for the request (tell the scorers), or say why none."""
        cands, why_not = self.candidates(instances, exclude)
        if not cands:
            return PickResult(None, why_not)
        cands = place(request.adapter, cands).candidates
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
            best = max(scores)
            near = [(s, c) for s, c in zip(scores, cands) if s >= best - self.config.tie_margin]
            if len(near) >= 2:
                a, b = self._rng.sample(near, 2)
                chosen = max((a, b), key=lambda sc: (sc[0], -sc[1].est_load))[1]
            else:
                chosen = near[0][1]
        for scorer, _ in self.scorers:
            scorer.on_picked(request, chosen)
        return chosen, scores
