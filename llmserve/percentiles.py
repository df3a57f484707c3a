"""The percentile of the project's decisions and reports: nearest rank.

The live system's signals and canary checks, the simulator's summaries, the
fidelity report and the benchmark scripts call :func:`percentile` (``llmserve
bench`` alone interpolates, as ``vllm bench serve`` does, so its figures compare). Nearest rank (Hyndman and Fan's type 1, numpy's
``method="inverted_cdf"``), not interpolation: a p99 is a latency some request
really had, and the simulator reports what the live controller would have seen.
The epsilon keeps ``q / 100 * n`` from rounding up past an exact rank.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")


def rank(n: int, q: float) -> int:
    """The 0-based index of the ``q``-th percentile (``q`` in [0, 100]) among ``n`` sorted values."""
    return max(0, min(n - 1, math.ceil(q / 100.0 * n - 1e-9) - 1))


def percentile(values: Iterable[float], q: float, *, is_sorted: bool = False, empty: T = None) -> float | T:
    """The ``q``-th percentile of ``values`` (NaNs left out); ``empty`` when there are none.

    ``is_sorted``: the values are an ascending list without NaNs (the live windows
    keep theirs sorted), so they are not copied and sorted again."""
    if is_sorted:
        ordered = values if isinstance(values, list) else list(values)
    elif hasattr(values, "dtype"):  # a numpy array: partition, do not sort in Python
        import numpy as np

        arr = np.asarray(values, dtype=float)
        arr = arr[~np.isnan(arr)]
        if not len(arr):
            return empty
        k = rank(len(arr), q)
        return float(np.partition(arr, k)[k])
    else:
        ordered = sorted(v for v in values if v == v)  # v != v: NaN
    if not ordered:
        return empty
    return ordered[rank(len(ordered), q)]


def percentiles(values: Collection[float], qs: Sequence[float], empty: T = None) -> list[float | T]:
    """Several percentiles of ``values`` (no NaNs) at once, as :func:`percentile` gives each:
    one partition at the ranks instead of a sort (a signal window of thousands each tick)."""
    n = len(values)
    if not n:
        return [empty] * len(qs)
    import numpy as np

    ks = [rank(n, q) for q in qs]
    # A float array is partitioned as it is (np.partition copies); anything else read into one.
    as_is = isinstance(values, np.ndarray) and values.dtype == np.float64
    arr = np.partition(values if as_is else np.fromiter(values, float, n), ks)
    return [float(arr[k]) for k in ks]
