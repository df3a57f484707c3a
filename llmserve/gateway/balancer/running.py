"""``running``: prefer the instance with the fewest requests in its running batch.

Uses the reported count corrected by what this gateway sent since the report.
"""

from __future__ import annotations

from llmserve.gateway.balancer.columns import ColumnScorer, Rule


class RunningScorer(ColumnScorer):
    name = "running"
    attribute = "est_running"
    rule = Rule.LOWER_IS_BETTER
