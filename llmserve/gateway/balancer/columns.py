"""Column scorers: a scorer that is one attribute of the view under one rule.

Four of the five scorers (queue, running, kv, busy) read one number of each candidate's view
and turn it into a score by a fixed rule, so each is declared as ``(attribute, rule)`` rather
than written as a loop. The picker hands the declarations to ``compiled_score`` (``_columns.c``,
built with the package like the engine's kernels), which computes every declared column, and the
stateful scorers' own, clamps, weighs and adds them in one call: at a few dozen candidates the
passes per scorer were a quarter of a routing decision's cost, live and in the simulator alike.
It does the same floating-point operations in the same order as the Python path (each scorer's
``score``, then ``combine.weighted_mean``), so the picks are the same bits;
``tests/gateway/balancer/test_columns.py`` holds the two to that. It declines (``None``) a value
it does not take, and where the package was built without a compiler it is absent: the picker's
Python path decides then.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import ClassVar

from llmserve.gateway.balancer.base import RouteRequest, StatelessScorer, lower_is_better
from llmserve.gateway.instance import InstanceView

try:
    import llmserve.gateway.balancer._columns as _compiled
except ImportError:  # not built (no compiler at install): the Python path decides alone
    _compiled = None

COMPILED = _compiled is not None


class Rule(enum.IntEnum):
    LOWER_IS_BETTER = 0  # min-max normalised over the candidates, the lowest 1 (all equal: 1)
    ONE_MINUS = 1  # 1 - value, a fraction; None (no report yet) a neutral 0.5


class ColumnScorer(StatelessScorer):
    """Scores each candidate by ``rule`` over its view's ``attribute``."""

    attribute: ClassVar[str]
    rule: ClassVar[Rule]

    def score(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> list[float]:
        values = [getattr(c, self.attribute) for c in candidates]
        if self.rule is Rule.LOWER_IS_BETTER:
            return lower_is_better(values)
        return [0.5 if v is None else 1.0 - v for v in values]


def _declined(candidates: list[InstanceView], spec: tuple, weights: tuple[float, ...], total: float) -> None:
    return None


# (candidates, spec, weights, total) -> the weighted mean of the clamped columns, or None: the
# caller takes the Python path. spec: per scorer, (attribute, rule) or its own column.
compiled_score = _compiled.score if _compiled is not None else _declined
