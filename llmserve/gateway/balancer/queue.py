"""``queue``: prefer the instance with the fewest requests waiting in its engine."""

from __future__ import annotations

from llmserve.gateway.balancer.columns import ColumnScorer, Rule


class QueueScorer(ColumnScorer):
    name = "queue"
    attribute = "est_waiting"
    rule = Rule.LOWER_IS_BETTER
