"""``llmserve simulate``'s flag checks: a bad value is one line naming the flag (exit 2).

Each check raises ValueError, which the entry point prints as one line with exit
code 2, before any trace is built or a run starts: a value that would only fail
deep inside a run (an index error, a pool that never sizes) or silently mean
something else (``--hours 0`` taken as the default) is refused here instead.
"""

from __future__ import annotations

import argparse
import math

from llmserve.sim.traces import LengthDist


def _positive(args: argparse.Namespace, name: str) -> None:
    v = getattr(args, name, None)
    if v is not None and not (v > 0 and math.isfinite(v)):  # NaN fails `v > 0` too
        raise ValueError(f"--{name.replace('_', '-')} must be a positive number, got {v:g}")


def _within(args: argparse.Namespace, name: str, lo: float, hi: float, lo_open: bool = False) -> None:
    v = getattr(args, name, None)
    if v is None:
        return
    if not ((lo < v if lo_open else lo <= v) and v <= hi):
        bracket = "(" if lo_open else "["
        raise ValueError(f"--{name.replace('_', '-')} must be in {bracket}{lo:g}, {hi:g}], got {v:g}")


def lengths(flag: str, spec: str | None, default: LengthDist) -> LengthDist:
    """``MEDIAN[:SIGMA]`` as a length distribution; ``default``'s sigma and bounds otherwise."""
    if spec is None:
        return default
    median, _, sigma = spec.partition(":")
    try:
        m, s = float(median), float(sigma) if sigma else default.sigma
    except ValueError:
        raise ValueError(f"{flag} must be MEDIAN[:SIGMA] (numbers), got {spec!r}") from None
    if not (m > 0 and math.isfinite(m) and s >= 0 and math.isfinite(s)):
        raise ValueError(f"{flag} needs a positive median and a sigma >= 0, got {spec!r}")
    return LengthDist(median=m, sigma=s, lo=default.lo, hi=default.hi)


def static_instances(spec: str) -> int | None:
    """``--static-instances``: None for ``auto``, else a count of at least one."""
    if spec == "auto":
        return None
    try:
        n = int(spec)
    except ValueError:
        raise ValueError(f"--static-instances must be 'auto' or a whole number, got {spec!r}") from None
    if n < 1:  # the pool's bounds start one anyway: a static-0 row would report a pool it did not run
        raise ValueError(f"--static-instances must be >= 1 (or auto), got {n}")
    return n


def check_simulate_args(args: argparse.Namespace) -> None:
    """Refuse values that cannot mean what they say, before anything runs."""
    for name in ("hours", "peak_rps", "base_rps", "high_rps", "time_scale", "cold_start", "capacity_prior"):
        _positive(args, name)
    if getattr(args, "peak_to_trough", None) is not None and not args.peak_to_trough >= 1:
        raise ValueError(f"--peak-to-trough must be >= 1, got {args.peak_to_trough:g}")
    _within(args, "batch_fraction", 0.0, 1.0)
    _within(args, "oracle_target", 0.0, 1.0, lo_open=True)
    if getattr(args, "initial_instances", None) is not None and args.initial_instances < 0:
        raise ValueError(f"--initial-instances must be >= 0, got {args.initial_instances}")
    if getattr(args, "static_instances", None) is not None:
        static_instances(args.static_instances)
