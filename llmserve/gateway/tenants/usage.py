"""Usage per named key: the ``llmserve:gateway_key_*`` metrics and this replica's totals
(``GET /admin/keys/{id}/usage`` adds what every replica counted). Keys appear by name only."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge

from llmserve.gateway.metrics import P
from llmserve.gateway.tenants.config import Prices

if TYPE_CHECKING:
    from llmserve.gateway.metrics import GatewayMetrics


class KeyUsage:
    def __init__(self, metrics: GatewayMetrics, prices: dict[str, Prices], degraded: Callable[[], bool]) -> None:
        self.metrics, self.prices, self.degraded = metrics, prices, degraded
        r = metrics.registry
        self.requests = Counter(f"{P}key_requests", "Requests of each named key: admitted, or refused by "
                                "its requests, tokens, concurrent or budget limit", ["key", "outcome"], registry=r)
        self.token_count = Counter(f"{P}key_tokens", "Tokens charged to each named key", ["key", "kind"],
                                   registry=r)
        self.spend = Counter(f"{P}key_spend", "Spend charged to each named key (tokens x the model's "
                             "price_per_1k_*), in the prices' currency", ["key"], registry=r)
        Gauge(f"{P}limits_degraded", "1 while the shared store is unreachable and this replica enforces its "
              "1/N share of every key's limits alone", registry=r).set_function(lambda: float(self.degraded()))
        self.totals: dict[str, dict[str, float]] = {}

    def total(self, key: str) -> dict[str, float]:
        t = self.totals.get(key)
        if t is None:
            t = self.totals[key] = {"requests": 0, "refused": 0, "prompt_tokens": 0, "completion_tokens": 0,
                                    "spend": 0.0}
        return t

    def request(self, key: str, outcome: str) -> None:
        self.metrics.child(self.requests, key, outcome).inc()
        self.total(key)["requests" if outcome == "admitted" else "refused"] += 1

    def tokens(self, key: str, model: str, prompt: int, completion: int) -> None:
        m, t = self.metrics, self.total(key)
        m.child(self.token_count, key, "prompt").inc(prompt)
        m.child(self.token_count, key, "completion").inc(completion)
        p = self.prices.get(model, Prices())
        cost = (prompt * p.prompt + completion * p.completion) / 1000
        if cost:
            m.child(self.spend, key).inc(cost)
        t["prompt_tokens"] += prompt
        t["completion_tokens"] += completion
        t["spend"] += cost
