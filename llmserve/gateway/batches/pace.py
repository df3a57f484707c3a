"""How many batch lines to keep in flight: idle capacity first, more only when a window needs it.

Pure. A batch normally runs ``base`` lines at a time: :func:`base_in_flight`, a few
per ready instance (with the predictive policy, as many as its forecast leaves room
for: :mod:`llmserve.gateway.batches.share`), so the idle seats of a pool of any size are filled (admission
keeps each instance's realtime reserve free; lines past the free seats wait in
the batch queue, behind realtime), while on one instance it leaves the engine to
realtime traffic (``benchmarks/batches/README.md``). The rest of the backlog
waits in the state folder rather than in the admission queues, so it never makes
a pool look busier than its realtime load. Only a batch that would miss its
completion window at its current pace gets more lines in flight, in proportion
to how far behind it is, up to ``ceiling``.

The autoscaler is told :func:`told_need`: the lines per second the window needs,
and only while the pace measured with the idle seats filled falls short of it,
never the backlog itself. The policies size a pool for realtime demand plus that
rate only (:mod:`llmserve.autoscale.batch_need`), so a batch that idle capacity
carries adds no instance (a 20,000-line day: ``benchmarks/sim/README.md``).
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


def base_in_flight(per_instance: int, ready_instances: int, ceiling: int) -> int:
    """``per_instance`` lines for each ready instance (one at least), up to ``ceiling``."""
    return max(1, min(per_instance * max(ready_instances, 1), ceiling))


def told_need(remaining: int, seconds_left: float, lines_per_s: float | None) -> float:
    """What the autoscaler is told: :func:`required_rate` while the measured pace falls
    short of it, else 0 (idle capacity first; not measured yet: 0, measure first)."""
    need = required_rate(remaining, seconds_left)
    return need if lines_per_s is not None and lines_per_s < need else 0.0


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
