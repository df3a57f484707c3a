"""The scorer contract shared by the balancer's plugins.

A scorer looks at the request and the candidate instances (already filtered to
those that may take it) and gives each a score in [0, 1], higher is better. The
picker combines scores with configured weights. Scorers never see each other, so
each is a small class in its own module with its own test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from llmserve.gateway.instance import InstanceView


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What the balancer knows of a request."""

    prefix_text: str = ""  # the prompt as text (chat messages flattened), for affinity
    user: str | None = None
    adapter: str | None = None  # the LoRA adapter the request runs on (None: the base model)


class Scorer(Protocol):
    """Scores candidates for one request.

    ``score`` returns one value in [0, 1] per candidate, in order, higher is
    better; it must not mutate anything. ``on_picked`` tells a stateful scorer
    (prefix affinity) where the request went.
    """

    name: ClassVar[str]

    def score(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> list[float]: ...

    def on_picked(self, request: RouteRequest, instance: InstanceView) -> None: ...


class StatelessScorer:
    name: ClassVar[str] = ""

    def on_picked(self, request: RouteRequest, instance: InstanceView) -> None:
        return None


def lower_is_better(values: Sequence[float]) -> list[float]:
    """Min-max normalise so the lowest value scores 1 and the highest 0 (all equal: 1)."""
    if not values:
        return []
    lo, hi = min(values), max(values)
    if hi <= lo:
        return [1.0] * len(values)
    span = hi - lo
    return [(hi - v) / span for v in values]
