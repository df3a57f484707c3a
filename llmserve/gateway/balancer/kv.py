"""``kv``: prefer the instance with the lowest KV cache use (1 - usage).

An instance without a report scores a neutral 0.5.
"""

from __future__ import annotations

from llmserve.gateway.balancer.columns import ColumnScorer, Rule


class KVScorer(ColumnScorer):
    name = "kv"
    attribute = "kv_usage"  # kept by the view
    rule = Rule.ONE_MINUS
