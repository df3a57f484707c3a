"""The statistical tests behind a canary verdict: pure functions of counts and samples.

Each signal is a non-inferiority question with a margin: "is the canary worse than
the stable version by more than the margin?" Each test answers at a stated
one-sided confidence:

- FAIL: the evidence shows the canary worse than the margin allows;
- PASS: the evidence shows it is not (the whole confidence bound lies inside the margin);
- INCONCLUSIVE: neither yet; the analysis keeps collecting.

Proportions (error and refusal rates) use Newcombe's hybrid score bound on the
difference of two proportions, built from the two Wilson score intervals: it keeps
its coverage at small counts and at rates near 0, where the plain normal bound does
not. Latencies (TTFT, TPOT per token, end to end) and output lengths use the
Mann-Whitney rank test, as Kayenta does, against the stable samples moved to the
margin (``ratio * stable + slack``), so a heavy tail or a few outliers do not decide.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np


class Verdict(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True, slots=True)
class Finding:
    """One signal's verdict, with the numbers that led to it (for the history)."""

    signal: str
    verdict: Verdict
    detail: str


@lru_cache(maxsize=64)
def z_of(confidence: float) -> float:
    """The one-sided normal quantile for ``confidence``."""
    return NormalDist().inv_cdf(confidence)


def wilson(k: int, n: int, z: float) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (two one-sided bounds at z)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def excess_bounds(kc: int, nc: int, ks: int, ns: int, z: float,
                  ratio: float = 1.0) -> tuple[float, float]:
    """Lower and upper one-sided bounds on ``p_canary - ratio * p_stable`` (Newcombe)."""
    pc, ps = (kc / nc if nc else 0.0), (ks / ns if ns else 0.0)
    lc, uc = wilson(kc, nc, z)
    ls, us = wilson(ks, ns, z)
    d = pc - ratio * ps
    lower = d - math.sqrt((pc - lc) ** 2 + (ratio * (us - ps)) ** 2)
    upper = d + math.sqrt((uc - pc) ** 2 + (ratio * (ps - ls)) ** 2)
    return lower, upper


def proportion_test(signal: str, kc: int, nc: int, ks: int, ns: int, *, margin: float,
                    confidence: float, floor: int, ratio: float = 1.0) -> Finding:
    """Is the canary's rate over ``ratio * stable + margin``?"""
    z = z_of(confidence)
    lower, upper = excess_bounds(kc, nc, ks, ns, z, ratio)
    what = "canary - stable" if ratio == 1.0 else f"canary - {ratio:g} x stable"
    detail = (f"{signal} canary {kc}/{nc} ({kc / max(nc, 1):.3f}) vs stable {ks}/{ns} "
              f"({ks / max(ns, 1):.3f}); {what} in [{lower:+.4f}, {upper:+.4f}] at "
              f"{confidence:.0%} each side, margin {margin:g}")
    if min(nc, ns) < floor:
        return Finding(signal, Verdict.INCONCLUSIVE, f"{detail}; below the floor of {floor}")
    if lower > margin:
        return Finding(signal, Verdict.FAIL, detail)
    if upper <= margin:
        return Finding(signal, Verdict.PASS, detail)
    return Finding(signal, Verdict.INCONCLUSIVE, detail)


def rank_z(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Mann-Whitney: the normal score of U (x above y; ties count a half, variance
    tie-corrected, continuity-corrected) and the estimate of P(x > y)."""
    n1, n2 = len(x), len(y)
    ys = np.sort(y)
    below = np.searchsorted(ys, x, "left")
    upto = np.searchsorted(ys, x, "right")
    u = float(below.sum() + 0.5 * (upto - below).sum())
    n = n1 + n2
    _, counts = np.unique(np.concatenate([x, y]), return_counts=True)
    ties = float((counts.astype(np.float64) ** 3 - counts).sum())
    var = n1 * n2 / 12.0 * ((n + 1) - ties / (n * (n - 1)))
    share = u / (n1 * n2)
    if var <= 0:  # every value equal: no evidence either way
        return 0.0, share
    dev = u - n1 * n2 / 2.0
    dev = math.copysign(max(0.0, abs(dev) - 0.5), dev)
    return dev / math.sqrt(var), share


def rank_test(signal: str, canary: list[float], stable: list[float], *, ratio: float,
              slack: float, confidence: float, floor: int, higher_is_worse: bool = True,
              unit: str = "ms") -> Finding:
    """Is the canary's distribution beyond ``ratio * stable + slack`` (above it, or
    below it when lower is worse, as for output length)?"""
    nc, ns = len(canary), len(stable)
    scale = 1000.0 if unit == "ms" else 1.0
    if min(nc, ns) < floor:
        return Finding(signal, Verdict.INCONCLUSIVE,
                       f"{signal}: {nc} canary and {ns} stable samples, below the floor of {floor}")
    x = np.asarray(canary, dtype=np.float64)
    margin = ratio * np.asarray(stable, dtype=np.float64) + slack
    z, share = rank_z(x, margin)
    if not higher_is_worse:
        z, share = -z, 1.0 - share
    crit = z_of(confidence)
    bound = f"{ratio:g} x stable" + (f" + {slack * scale:g} {unit}" if slack else "")
    detail = (f"{signal} median canary {np.median(x) * scale:.4g} {unit} vs stable "
              f"{np.median(stable) * scale:.4g} {unit} over {nc}/{ns} samples; "
              f"P(canary {'above' if higher_is_worse else 'below'} {bound}) = {share:.3f}, "
              f"rank z {z:+.2f} against {crit:.2f} at {confidence:.0%}")
    if z > crit:
        return Finding(signal, Verdict.FAIL, detail)
    if z < -crit:
        return Finding(signal, Verdict.PASS, detail)
    return Finding(signal, Verdict.INCONCLUSIVE, detail)
