"""When each request is sent: arrival offsets planned up front, from a seed.

Arrivals are computed before the run as plain numbers (seconds from the start),
so a given rate, burstiness and seed always give the same schedule, tests can
check the schedule without sleeping, and the sender only has to wait until each
offset (no drift accumulates from sleeping gap after gap).

The model is a renewal process in "operational time": gaps are gamma-distributed
with mean 1 and shape ``burstiness`` (1 gives a Poisson process, below 1 burstier,
above 1 more regular, as in ``vllm bench serve``), and operational time is mapped
to wall time through the cumulative rate ``Λ(t) = ∫ rate``. A constant rate is the
one-row trace ``(0, rate)``; a rate-over-time trace drives the autoscaler through
load changes with the same code.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np

# Sub-stream of the run seed, so datasets and arrivals draw independent numbers.
ARRIVAL_STREAM = 1


@dataclass(slots=True, frozen=True)
class RatePoint:
    """The request rate (req/s) at ``time_s``; the rate is linear between points."""

    time_s: float
    rate: float

    def __post_init__(self) -> None:
        if not (self.time_s >= 0 and math.isfinite(self.time_s)):
            raise ValueError(f"trace time must be a finite number >= 0, got {self.time_s}")
        if not (self.rate >= 0 and math.isfinite(self.rate)):
            raise ValueError(f"trace rate must be a finite number >= 0, got {self.rate}")


def validate_trace(trace: Sequence[RatePoint]) -> None:
    if not trace:
        raise ValueError("rate trace is empty")
    if trace[0].time_s != 0:
        raise ValueError(f"rate trace must start at time 0, starts at {trace[0].time_s}")
    for a, b in pairwise(trace):
        if b.time_s < a.time_s:
            raise ValueError(f"rate trace times must not decrease ({a.time_s} then {b.time_s})")


def load_rate_trace(path: str | Path) -> list[RatePoint]:
    """Read a CSV of ``time_s,rate`` rows (a header row is allowed).

    The rate is interpolated linearly between rows, so two rows make a ramp and two
    rows at the same time make a step. After the last row its rate holds; a last
    rate of 0 ends the run early (fewer requests than --num-prompts are sent).
    """
    points: list[RatePoint] = []
    with open(path, newline="") as f:
        for lineno, row in enumerate(csv.reader(f), start=1):
            cells = [c.strip() for c in row]
            if not cells or not any(cells) or cells[0].startswith("#"):
                continue
            try:
                t, r = float(cells[0]), float(cells[1])
            except (ValueError, IndexError):
                if lineno == 1 and not points:
                    continue  # header
                raise ValueError(f"{path}:{lineno}: expected 'time_s,rate', got {row!r}") from None
            points.append(RatePoint(t, r))
    validate_trace(points)
    return points


def unit_gaps(n: int, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` gaps of mean 1: gamma(shape=burstiness), or all 1 for infinite burstiness."""
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    if math.isinf(burstiness):
        return np.ones(n)
    return rng.gamma(shape=burstiness, scale=1.0 / burstiness, size=n)


def invert_cumulative_rate(trace: Sequence[RatePoint], targets: np.ndarray) -> np.ndarray:
    """Wall times ``t`` with ``Λ(t) = target`` for sorted targets; inf where never reached."""
    validate_trace(trace)
    out = np.full(len(targets), np.inf)
    i = 0  # next target to place
    area_before = 0.0
    segments = [(a, b.time_s - a.time_s, (b.rate - a.rate)) for a, b in pairwise(trace)]
    for start, length, rise in segments:
        if length == 0:
            continue  # a step: no area
        slope = rise / length
        seg_area = start.rate * length + 0.5 * slope * length * length
        while i < len(targets) and targets[i] - area_before <= seg_area:
            out[i] = start.time_s + _solve_in_segment(start.rate, slope, targets[i] - area_before)
            i += 1
        area_before += seg_area
    last = trace[-1]
    if last.rate > 0:
        out[i:] = last.time_s + (targets[i:] - area_before) / last.rate
    return out


def _solve_in_segment(r0: float, slope: float, a: float) -> float:
    """Smallest τ >= 0 with ``r0·τ + slope·τ²/2 = a``; stable for either sign of slope."""
    if a <= 0:
        return 0.0
    disc = r0 * r0 + 2.0 * slope * a
    return 2.0 * a / (r0 + math.sqrt(max(disc, 0.0)))


def plan_arrivals(
    n: int,
    rate: float = math.inf,
    burstiness: float = 1.0,
    seed: int = 0,
    trace: Sequence[RatePoint] | None = None,
) -> np.ndarray:
    """Send offsets in seconds (non-decreasing) for up to ``n`` requests.

    With no trace and an infinite rate every offset is 0 (all requests at once).
    With a trace the result is shorter than ``n`` when the trace ends at rate 0
    before ``n`` arrivals.
    """
    if n < 0:
        raise ValueError(f"number of requests must be >= 0, got {n}")
    if trace is None:
        if not rate > 0:
            raise ValueError(f"request rate must be > 0 (inf for all at once), got {rate}")
        if math.isinf(rate):
            return np.zeros(n)
        trace = [RatePoint(0.0, rate)]
    rng = np.random.default_rng((seed, ARRIVAL_STREAM))
    targets = np.cumsum(unit_gaps(n, burstiness, rng))
    times = invert_cumulative_rate(trace, targets)
    return times[np.isfinite(times)]
