"""``running``: prefer the instance with the fewest requests in its running batch.

Uses the reported count corrected by what this gateway sent since the report.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmserve.gateway.balancer.base import RouteRequest, StatelessScorer, lower_is_better
from llmserve.gateway.instance import InstanceView


class RunningScorer(StatelessScorer):
    name = "running"

    def score(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> list[float]:
        return lower_is_better([c.est_running for c in candidates])
