"""``kv``: prefer the instance with the lowest KV cache use (1 - usage).

An instance without a report scores a neutral 0.5.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmserve.gateway.balancer.base import RouteRequest, StatelessScorer
from llmserve.gateway.instance import InstanceView


class KVScorer(StatelessScorer):
    name = "kv"

    def score(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> list[float]:
        return [0.5 if c.kv_usage is None else 1.0 - c.kv_usage for c in candidates]  # kept by the view
