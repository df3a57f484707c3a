"""Core sharing: how much slower an instance steps while others on its machine are busy too.

Live, every instance is an engine process of ``threads`` torch threads plus its
API process (HTTP, tokenising, SSE), and they share the machine's ``cores`` with
the gateway. A profile is calibrated with one instance busy; with ``busy`` of
them each needs ``threads * (1 + api_share)`` cores, and once that asks for more
than the machine has, every step stretches in proportion::

    demand(b) = b * threads * (1 + api_share)
    slowdown(b) = max(1, demand(b) / cores) / max(1, demand(1) / cores)

``api_share`` is what each engine thread's serving around it costs in cores; it
is fitted from two busy instances measured side by side
(:func:`fit_api_share`), or 0 (engine threads against cores alone).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class CoreSharing:
    """The machine the instances share and what each busy one takes of it."""

    cores: int
    threads: int
    api_share: float = 0.0

    def __post_init__(self) -> None:
        if self.cores < 1 or self.threads < 1:
            raise ValueError(f"core sharing: cores and threads must be >= 1, got {self.cores}, {self.threads}")
        if self.api_share < 0:
            raise ValueError(f"core sharing: api_share must be >= 0, got {self.api_share}")

    def demand(self, busy: int) -> float:
        return busy * self.threads * (1.0 + self.api_share)

    def slowdown(self, busy: int) -> float:
        """Step-time factor with ``busy`` instances busy, against one busy (as calibrated)."""
        if busy <= 1:
            return 1.0
        return max(1.0, self.demand(busy) / self.cores) / max(1.0, self.demand(1) / self.cores)


def fit_api_share(cores: int, threads: int, busy: int, ratios: Iterable[float]) -> float:
    """The ``api_share`` whose slowdown at ``busy`` is the median measured step-time ratio.

    Solves ``slowdown(busy) = r`` for the ratio ``r`` of step times with ``busy``
    instances busy against one. A ratio of 1 or less means no sharing cost (0); a
    ratio the model cannot reach (above ``busy``) is capped where it saturates.
    """
    r = float(np.median(np.asarray(list(ratios), dtype=float)))
    if busy < 2:
        raise ValueError("core sharing: the fit needs two or more busy instances")
    if not r > 0:
        raise ValueError(f"core sharing: step-time ratios must be positive, got median {r}")
    # Below saturation (one instance fits: threads * (1 + s) <= cores) slowdown = busy * demand(1) / cores.
    share = r * cores / (busy * threads) - 1.0
    return float(min(max(share, 0.0), max(0.0, cores / threads - 1.0)))


class BusyInstances:
    """Which of a simulation's instances are busy now: the one tally they share.

    Owned by the simulator, handed to each :class:`~llmserve.sim.instance.SimInstance`,
    which marks itself busy or idle whenever it plans a segment.
    """

    __slots__ = ("sharing", "busy")

    def __init__(self, sharing: CoreSharing) -> None:
        self.sharing = sharing
        self.busy: set[int] = set()

    def mark(self, iid: int, busy: bool) -> None:
        if busy:
            self.busy.add(iid)
        else:
            self.busy.discard(iid)

    def slowdown(self) -> float:
        return self.sharing.slowdown(len(self.busy))
