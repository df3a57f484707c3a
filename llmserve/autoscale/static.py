"""A fixed pool size: the baseline every elastic policy is priced against."""

from __future__ import annotations

from llmserve.autoscale.config import StaticConfig
from llmserve.autoscale.policy import Decision
from llmserve.autoscale.signals import PoolSignals


class StaticPolicy:
    """Always wants ``instances``; stateless."""

    def __init__(self, config: StaticConfig) -> None:
        self.config = config

    def initial_state(self) -> None:
        return None

    def decide(self, ctx: PoolSignals, state: None) -> Decision:
        n = self.config.instances
        return Decision(n, None, f"static pool of {n}")
