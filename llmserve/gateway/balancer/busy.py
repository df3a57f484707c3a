"""``busy``: prefer the instance that spent the least recent wall time in forward passes.

An instance without a report scores a neutral 0.5.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmserve.gateway.balancer.base import RouteRequest, StatelessScorer
from llmserve.gateway.instance import InstanceView


class BusyScorer(StatelessScorer):
    name = "busy"

    def score(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> list[float]:
        return [0.5 if c.busy_fraction is None else 1.0 - c.busy_fraction for c in candidates]  # kept by the view
