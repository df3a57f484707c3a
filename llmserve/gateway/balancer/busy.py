"""``busy``: prefer the instance that spent the least recent wall time in forward passes.

An instance without a report scores a neutral 0.5.
"""

from __future__ import annotations

from llmserve.gateway.balancer.columns import ColumnScorer, Rule


class BusyScorer(ColumnScorer):
    name = "busy"
    attribute = "busy_fraction"  # kept by the view
    rule = Rule.ONE_MINUS
