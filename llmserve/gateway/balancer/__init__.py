"""Load-aware instance picking: scorer plugins (by name) and the picker."""

from llmserve.gateway.balancer.base import RouteRequest, Scorer, lower_is_better
from llmserve.gateway.balancer.busy import BusyScorer
from llmserve.gateway.balancer.kv import KVScorer
from llmserve.gateway.balancer.picker import (SCORERS, BalancerConfig, NoPick, Picker,
                                              PickResult, make_scorers)
from llmserve.gateway.balancer.prefix import PrefixAffinityScorer, PrefixConfig, prefix_hashes
from llmserve.gateway.balancer.queue import QueueScorer
from llmserve.gateway.balancer.running import RunningScorer

__all__ = [
    "SCORERS", "BalancerConfig", "BusyScorer", "KVScorer", "NoPick", "PickResult", "Picker",
    "PrefixAffinityScorer", "PrefixConfig", "QueueScorer", "RouteRequest", "RunningScorer",
    "Scorer", "lower_is_better", "make_scorers", "prefix_hashes",
]
