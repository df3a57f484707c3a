"""``queue``: prefer the instance with the fewest requests waiting in its engine."""

from __future__ import annotations

from collections.abc import Sequence

from llmserve.gateway.balancer.base import RouteRequest, StatelessScorer, lower_is_better
from llmserve.gateway.instance import InstanceView


class QueueScorer(StatelessScorer):
    name = "queue"

    def score(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> list[float]:
        return lower_is_better([c.est_waiting for c in candidates])
