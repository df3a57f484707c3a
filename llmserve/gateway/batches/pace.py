"""How many batch lines to keep in flight: idle capacity first, more only when a window needs it.

Pure. A batch normally runs ``base`` lines at a time, which leaves the engines to
realtime traffic (``benchmarks/batches/README.md``) and, since the rest of the
backlog waits in the state folder rather than in the admission queues, never
makes a pool look busier than its realtime load: the backlog alone does not
scale a pool up. Only a batch that would miss its completion window at its
current pace gets more lines in flight, in proportion to how far behind it is,
up to ``ceiling``; those queue at the gateway in the batch class.

The autoscaler is told :func:`required_rate` (the lines per second the window
needs), never the backlog itself: the policies size a pool for realtime demand
plus that rate only (:mod:`llmserve.autoscale.batch_need`), so a batch whose
window idle capacity can meet adds no instance.
"""

from __future__ import annotations

import math
from collections import deque


def required_rate(remaining: int, seconds_left: float, margin: float = 0.8) -> float:
    """Lines per second that finish ``remaining`` lines within ``margin`` of ``seconds_left``
    (past the window: all of them within the next second)."""
    if remaining <= 0:
        return 0.0
    if seconds_left <= 0:
        return float(remaining)
    return remaining / (seconds_left * margin)


def lines_in_flight(base: int, ceiling: int, remaining: int, lines_per_s: float | None, seconds_left: float,
                    margin: float = 0.8) -> int:
    """``remaining`` lines to finish in ``seconds_left``; ``lines_per_s`` is the pace
    seen with ``base`` in flight (None: not measured yet). Aims to finish within
    ``margin`` of the time left."""
    if remaining <= 0:
        return 0
    if seconds_left <= 0:
        return ceiling
    if not lines_per_s:
        return base
    needed = required_rate(remaining, seconds_left, margin)
    if needed <= lines_per_s:
        return base
    return min(ceiling, max(base, math.ceil(base * needed / lines_per_s)))


class PaceMeter:
    """Lines finished per second over the last ``window_s``, from (time, finished) samples;
    None until the samples span a sixth of the window. The runner and the simulator both use it."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._seen: deque[tuple[float, int]] = deque()

    def rate(self, now: float, finished: int) -> float | None:
        seen = self._seen
        seen.append((now, finished))
        while now - seen[0][0] > self.window_s:
            seen.popleft()
        span = seen[-1][0] - seen[0][0]
        return (seen[-1][1] - seen[0][1]) / span if span >= self.window_s / 6 else None
