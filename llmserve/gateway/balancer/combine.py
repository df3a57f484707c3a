"""The picker's score: the weighted mean of the scorers' columns, each clamped to [0, 1].

A candidate's score is ``(w1*clamp(s1) + w2*clamp(s2) + ...) / (w1 + w2 + ...)``, added
left to right in scorer order (a NaN clamps to 0). It is computed once per pick over every
candidate: the picker's compiled score (``columns.py``, ``_columns.c``) does it where built,
and this is its Python path, the reference the compiled one is tested against. It does the
very same floating-point operations in the same order (so the same bits, and the same picks),
in one pass over the candidates per two columns instead of one per column. A column that is all zero (the
prefix scorer for a prompt nobody has served yet) is skipped: adding ``w * 0.0`` to a sum
of non-negative terms leaves it as it was, for any finite weight.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def weighted_mean(columns: Sequence[Sequence[float]], weights: Sequence[float], total: float) -> list[float]:
    """``columns[k][i]`` weighted by ``weights[k]``, per candidate ``i``; ``total`` the weights' sum."""
    first, w0 = columns[0], weights[0]
    rest = [(c, w) for c, w in zip(columns[1:], weights[1:]) if any(c) or not math.isfinite(w)]
    # clamp(x) written out, x if 0 < x < 1 else (1 if x >= 1 else 0), NaN -> 0: a call per value costs more.
    # The first pass takes one column more when that leaves the rest in pairs; the last divides.
    if not rest:
        return [w0 * (x if 0.0 < x < 1.0 else (1.0 if x >= 1.0 else 0.0)) / total for x in first]
    if len(rest) % 2:
        (b, wb), rest = rest[0], rest[1:]
        acc = [w0 * (x if 0.0 < x < 1.0 else (1.0 if x >= 1.0 else 0.0))
               + wb * (y if 0.0 < y < 1.0 else (1.0 if y >= 1.0 else 0.0)) for x, y in zip(first, b)]
        if not rest:
            return [a / total for a in acc]
    else:
        acc = [w0 * (x if 0.0 < x < 1.0 else (1.0 if x >= 1.0 else 0.0)) for x in first]
    for k in range(0, len(rest) - 2, 2):
        (b, wb), (c, wc) = rest[k], rest[k + 1]
        acc = [(a + wb * (y if 0.0 < y < 1.0 else (1.0 if y >= 1.0 else 0.0)))
               + wc * (z if 0.0 < z < 1.0 else (1.0 if z >= 1.0 else 0.0)) for a, y, z in zip(acc, b, c)]
    (b, wb), (c, wc) = rest[-2], rest[-1]
    return [((a + wb * (y if 0.0 < y < 1.0 else (1.0 if y >= 1.0 else 0.0)))
             + wc * (z if 0.0 < z < 1.0 else (1.0 if z >= 1.0 else 0.0))) / total for a, y, z in zip(acc, b, c)]
