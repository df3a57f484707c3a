"""Request traces for the capacity simulator: built-in shapes and CSV files.

A trace is columns of numbers (arrival time, prompt and output lengths, class),
not a list of objects: a day can hold hundreds of thousands of requests and the
simulator reads them in order. Built-in traces are non-homogeneous Poisson
processes over a rate curve, drawn from a seeded generator so a run is
reproducible:

- ``diurnal``: a 24-hour day, sinusoidal between a trough and a peak ``ratio``
  times higher, times slow multiplicative noise (log-normal, correlated over a
  few minutes, as real traffic wanders rather than jitters);
- ``bursty``: a steady base with flash crowds (a fast rise to several times the
  base, then an exponential decay) at random times;
- ``ramp``: low, a linear ramp up, high, a ramp down, low again;
- ``csv``: a file of ``timestamp,prompt_tokens,output_tokens[,priority]``.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from llmserve.priority import BATCH, REALTIME, PriorityClass, parse_priority  # noqa: F401 (BATCH: re-export)

TRACE_NAMES = ("diurnal", "bursty", "ramp", "flash")


@dataclass(slots=True)
class LengthDist:
    """Log-normal token lengths: median, log-space sigma, clipped to [lo, hi]."""

    median: float
    sigma: float
    lo: int
    hi: int

    def __post_init__(self) -> None:
        if not (self.median > 0 and self.sigma >= 0 and 1 <= self.lo <= self.hi):
            raise ValueError(f"length distribution: bad parameters {self}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = rng.lognormal(math.log(self.median), self.sigma, n) if self.sigma > 0 else np.full(n, self.median)
        return np.clip(np.rint(x), self.lo, self.hi).astype(np.int64)

    def mean(self) -> float:
        """Mean before clipping, a good enough guide for sizing."""
        return self.median * math.exp(self.sigma ** 2 / 2)


def default_prompt_lengths() -> LengthDist:
    return LengthDist(median=300, sigma=0.8, lo=16, hi=2048)


def default_output_lengths() -> LengthDist:
    return LengthDist(median=400, sigma=0.8, lo=4, hi=2048)


@dataclass(slots=True)
class Trace:
    """Requests in arrival order, plus the rate curve they were drawn from (for plots)."""

    name: str
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    priority: np.ndarray
    duration_s: float
    rate_t: np.ndarray = field(default_factory=lambda: np.zeros(0))
    rate_rps: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if not (len(self.prompt_tokens) == len(self.output_tokens) == len(self.priority) == n):
            raise ValueError("trace: columns differ in length")
        if n and (np.any(np.diff(self.arrival_s) < 0) or self.arrival_s[0] < 0):
            raise ValueError("trace: arrival times must be sorted and non-negative")
        if n and (self.prompt_tokens.min() < 1 or self.output_tokens.min() < 1):
            raise ValueError("trace: prompt and output lengths must be >= 1")
        if n and self.duration_s < self.arrival_s[-1]:
            raise ValueError("trace: duration ends before the last arrival")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def peak_rps(self) -> float:
        return float(self.rate_rps.max()) if len(self.rate_rps) else len(self) / max(self.duration_s, 1e-9)

    def compressed(self, factor: float) -> "Trace":
        """The same requests played ``factor`` times faster: times divided, rates multiplied.

        Lengths are kept, so the work per request is the same and the load per
        second is ``factor`` times higher: how a day-long shape is replayed live in
        a minute against a small model.
        """
        if not factor > 0:
            raise ValueError(f"trace: compression factor must be positive, got {factor}")
        if factor == 1:
            return self
        return Trace(f"{self.name}/{factor:g}", self.arrival_s / factor, self.prompt_tokens, self.output_tokens,
                     self.priority, self.duration_s / factor, self.rate_t / factor, self.rate_rps * factor)

    def window(self, t0: float, t1: float) -> "Trace":
        """The requests arriving in [t0, t1), shifted to start at zero."""
        lo, hi = np.searchsorted(self.arrival_s, [t0, t1])
        keep = (self.rate_t >= t0) & (self.rate_t < t1)
        return Trace(f"{self.name}[{t0:g}:{t1:g}]", self.arrival_s[lo:hi] - t0, self.prompt_tokens[lo:hi],
                     self.output_tokens[lo:hi], self.priority[lo:hi], t1 - t0,
                     self.rate_t[keep] - t0, self.rate_rps[keep])


def from_rate_curve(name: str, rate_t: np.ndarray, rate_rps: np.ndarray, duration_s: float,
                    rng: np.random.Generator, prompt: LengthDist, output: LengthDist,
                    batch_fraction: float = 0.0) -> Trace:
    """Poisson arrivals under a piecewise-constant rate (``rate_rps[k]`` from ``rate_t[k]``)."""
    if not (duration_s > 0 and math.isfinite(duration_s)):
        raise ValueError(f"{name}: the trace's duration must be positive, got {duration_s:g} s")
    if not np.all(np.isfinite(rate_rps)) or np.any(np.asarray(rate_rps) < 0):
        raise ValueError(f"{name}: arrival rates must be finite and >= 0")
    if not 0 <= batch_fraction <= 1:
        raise ValueError(f"{name}: batch fraction must be in [0, 1], got {batch_fraction:g}")
    edges = np.append(rate_t, duration_s)
    widths = np.diff(edges)
    counts = rng.poisson(np.maximum(rate_rps, 0.0) * widths)
    starts = np.repeat(edges[:-1], counts)
    arrivals = np.sort(starts + rng.random(counts.sum()) * np.repeat(widths, counts))
    n = len(arrivals)
    priority = (rng.random(n) < batch_fraction).astype(np.int8)
    return Trace(name, arrivals, prompt.sample(rng, n), output.sample(rng, n), priority, duration_s,
                 np.asarray(rate_t, float), np.asarray(rate_rps, float))


def _noise(rng: np.random.Generator, n: int, step_s: float, sigma: float, corr_s: float) -> np.ndarray:
    """Mean-one log-normal multipliers following an AR(1) process in log space."""
    if sigma <= 0 or n == 0:
        return np.ones(n)
    rho = math.exp(-step_s / corr_s)
    eps = rng.standard_normal(n)
    x = np.empty(n)
    x[0] = eps[0]
    scale = math.sqrt(1 - rho * rho)
    for k in range(1, n):
        x[k] = rho * x[k - 1] + scale * eps[k]
    return np.exp(sigma * x - sigma * sigma / 2)


def diurnal(peak_rps: float = 2.0, ratio: float = 10.0, duration_s: float = 86400.0, peak_hour: float = 14.0,
            noise: float = 0.1, noise_corr_s: float = 600.0, seed: int = 0, step_s: float = 60.0,
            prompt: LengthDist | None = None, output: LengthDist | None = None,
            batch_fraction: float = 0.0) -> Trace:
    """A day: trough at ``peak_hour - 12``, peak ``ratio`` times the trough at ``peak_hour``."""
    if not (peak_rps > 0 and ratio >= 1 and duration_s > 0):
        raise ValueError("diurnal: peak_rps and duration must be positive and ratio >= 1")
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, duration_s, step_s)
    trough = peak_rps / ratio
    phase = 2 * math.pi * (t + step_s / 2 - peak_hour * 3600.0) / 86400.0
    base = trough + (peak_rps - trough) * (1 + np.cos(phase)) / 2
    rate = base * _noise(rng, len(t), step_s, noise, noise_corr_s)
    return from_rate_curve("diurnal", t, rate, duration_s, rng, prompt or default_prompt_lengths(),
                           output or default_output_lengths(), batch_fraction)


def bursty(base_rps: float = 0.5, burst_factor: float = 4.0, bursts_per_hour: float = 1.0,
           rise_s: float = 30.0, decay_s: float = 300.0, duration_s: float = 4 * 3600.0, seed: int = 0,
           step_s: float = 5.0, noise: float = 0.05, prompt: LengthDist | None = None,
           output: LengthDist | None = None, batch_fraction: float = 0.0) -> Trace:
    """A steady base with flash crowds: each adds ``(burst_factor - 1) * base`` at its top."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, duration_s, step_s)
    n_bursts = rng.poisson(bursts_per_hour * duration_s / 3600.0)
    starts = np.sort(rng.uniform(0, duration_s * 0.9, n_bursts))
    extra = np.zeros_like(t)
    for s in starts:
        dt = t - s
        up = np.clip(dt / rise_s, 0, 1)
        down = np.where(dt > rise_s, np.exp(-(dt - rise_s) / decay_s), 1.0)
        extra += np.where(dt >= 0, up * down, 0.0)
    rate = base_rps * (1 + (burst_factor - 1) * extra) * _noise(rng, len(t), step_s, noise, 120.0)
    return from_rate_curve("bursty", t, rate, duration_s, rng, prompt or default_prompt_lengths(),
                           output or default_output_lengths(), batch_fraction)


def flash(base_rps: float = 0.5, factor: float = 5.0, rise_s: float = 60.0, hold_s: float = 1200.0,
          crowds_at: tuple[float, ...] = (1800.0, 6600.0), duration_s: float = 3 * 3600.0, seed: int = 0,
          step_s: float = 5.0, noise: float = 0.05, prompt: LengthDist | None = None,
          output: LengthDist | None = None, batch_fraction: float = 0.0) -> Trace:
    """Flash crowds: the rate goes to ``factor`` times its base within ``rise_s``, holds
    for ``hold_s`` and falls back as fast, at each of ``crowds_at``."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, duration_s, step_s)
    level = np.zeros_like(t)
    for s in crowds_at:
        up = np.clip((t - s) / rise_s, 0, 1)
        down = np.clip((s + rise_s + hold_s + rise_s - t) / rise_s, 0, 1)
        level = np.maximum(level, np.minimum(up, down))
    rate = base_rps * (1 + (factor - 1) * level) * _noise(rng, len(t), step_s, noise, 120.0)
    return from_rate_curve("flash", t, rate, duration_s, rng, prompt or default_prompt_lengths(),
                           output or default_output_lengths(), batch_fraction)


def ramp(low_rps: float = 0.2, high_rps: float = 2.0, hold_s: float = 600.0, ramp_s: float = 1800.0,
         seed: int = 0, step_s: float = 10.0, prompt: LengthDist | None = None,
         output: LengthDist | None = None, batch_fraction: float = 0.0) -> Trace:
    """Low for ``hold_s``, up over ``ramp_s``, high for ``hold_s``, down over ``ramp_s``, low for ``hold_s``."""
    rng = np.random.default_rng(seed)
    duration = 3 * hold_s + 2 * ramp_s
    t = np.arange(0.0, duration, step_s)
    knots_t = [0, hold_s, hold_s + ramp_s, 2 * hold_s + ramp_s, 2 * hold_s + 2 * ramp_s, duration]
    knots_r = [low_rps, low_rps, high_rps, high_rps, low_rps, low_rps]
    rate = np.interp(t + step_s / 2, knots_t, knots_r)
    return from_rate_curve("ramp", t, rate, duration, rng, prompt or default_prompt_lengths(),
                           output or default_output_lengths(), batch_fraction)


def from_csv(path: str | Path, rate_step_s: float = 60.0) -> Trace:
    """Read ``timestamp,prompt_tokens,output_tokens[,priority]`` (header required).

    Timestamps are seconds (any origin; the first request is time zero) and need
    not be sorted. ``priority`` is ``realtime``/``batch`` or an integer (> 0 is batch).
    """
    rows = []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        need = {"timestamp", "prompt_tokens", "output_tokens"}
        if not reader.fieldnames or not need <= set(reader.fieldnames):
            raise ValueError(f"{path}: needs columns {sorted(need)}, got {reader.fieldnames}")
        for line, row in enumerate(reader, start=2):
            try:
                pri = parse_priority(row.get("priority") or None)
                cls = REALTIME if pri is None else int(PriorityClass.of(pri))  # the class, as 0 / 1
                ts, p, o = float(row["timestamp"]), int(row["prompt_tokens"]), int(row["output_tokens"])
                if not math.isfinite(ts):
                    raise ValueError(f"timestamp must be a finite number of seconds, got {row['timestamp']}")
                if p < 0 or o < 0:  # 0 is read as 1 (the least a request has); a negative is a broken row
                    raise ValueError(f"token counts must be >= 0, got prompt_tokens {p}, output_tokens {o}")
                rows.append((ts, p, o, cls))
            except (TypeError, ValueError) as e:
                raise ValueError(f"{path}:{line}: {e}") from None
    if not rows:
        raise ValueError(f"{path}: no requests")
    rows.sort()
    arr = np.array([r[0] for r in rows]) - rows[0][0]
    duration = float(arr[-1]) + 1e-6
    rate_t = np.arange(0.0, duration, rate_step_s)
    rate = np.histogram(arr, bins=np.append(rate_t, duration))[0] / rate_step_s
    return Trace(Path(path).stem, arr, np.array([max(1, r[1]) for r in rows], np.int64),
                 np.array([max(1, r[2]) for r in rows], np.int64), np.array([r[3] for r in rows], np.int8),
                 duration, rate_t, rate.astype(float))


def build_trace(name: str, seed: int = 0, **kwargs) -> Trace:
    """A built-in trace by name, or a CSV file when ``name`` ends in ``.csv``."""
    if name.endswith(".csv"):
        return from_csv(name)
    makers = {"diurnal": diurnal, "bursty": bursty, "ramp": ramp, "flash": flash}
    if name not in makers:
        raise ValueError(f"unknown trace {name!r}: use one of {TRACE_NAMES} or a .csv file")
    return makers[name](seed=seed, **kwargs)
