"""The one percentile the live system and the simulator's signals use: nearest rank.

Nearest rank (not interpolation) so a p99 is a latency some request really had;
the epsilon keeps ``q / 100 * n`` from rounding up past an exact rank.
"""

from __future__ import annotations

import math


def nearest_rank(sorted_values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (``q`` in [0, 100]) of an ascending list; None when empty."""
    if not sorted_values:
        return None
    n = len(sorted_values)
    k = max(0, min(n - 1, math.ceil(q / 100.0 * n - 1e-9) - 1))
    return sorted_values[k]
