"""Fit an instance profile's step-time model to measured engine steps.

The engine records, for each step it runs, how many prompt tokens it prefilled,
how many sequences it decoded, the total context those sequences attend to, and
the wall time of the step. A least-squares fit of::

    seconds ~ a + b * prefill_tokens + c * decode_seqs + d * sum_context

turns those rows into the :class:`~llmserve.sim.profile.StepModel` the simulator
runs. Coefficients are kept non-negative (a negative cost per token is noise
fitting noise, and would make big batches look free): a coefficient the plain
fit makes negative is fixed at zero and the rest refitted.

Measurements come as tuples ``(prefill_tokens, decode_seqs, sum_context, seconds)``
or from a CSV with those four columns.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from llmserve.sim.profile import InstanceProfile, StepModel

COLUMNS = ("prefill_tokens", "decode_seqs", "sum_context", "seconds")


@dataclass(frozen=True, slots=True)
class FitReport:
    """How well the fitted model explains the measurements."""

    n: int
    r2: float
    rmse_s: float
    mean_abs_rel_error: float


def nonneg_fit(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, FitReport]:
    """Least squares ``y ~ x @ coef`` with every coefficient >= 0; column 0 is the fixed cost.

    A coefficient the plain fit makes negative is fixed at zero and the rest refitted.
    """
    k = x.shape[1]
    active = [True] * k
    coef = np.zeros(k)
    for _ in range(k):
        cols = [j for j in range(k) if active[j]]
        sol, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
        coef = np.zeros(k)
        coef[cols] = sol
        negative = [j for j in cols if coef[j] < 0]
        if not negative:
            break
        # The fixed cost per step stays: every step takes time, and on a noisy machine
        # a fit that explains it away leaves no step model at all. Drop a slope instead.
        slopes = [j for j in cols if j != 0]
        drop = [j for j in negative if j != 0] or [min(slopes, key=lambda j: coef[j])] if slopes else []
        if not drop:
            break
        active[min(drop, key=lambda j: coef[j])] = False
    coef = np.maximum(coef, 0.0)
    resid = y - x @ coef
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid ** 2)) / ss_tot if ss_tot > 0 else 1.0
    return coef, FitReport(len(y), r2, float(np.sqrt(np.mean(resid ** 2))), float(np.mean(np.abs(resid) / y)))


def fit_step_model(measurements: Iterable[Sequence[float]]) -> tuple[StepModel, FitReport]:
    """Non-negative least squares over rows ``(prefill_tokens, decode_seqs, sum_context, seconds)``."""
    rows = np.asarray(list(measurements), dtype=float)
    if rows.ndim != 2 or rows.shape[1] != 4:
        raise ValueError("calibrate: each measurement needs 4 numbers: prefill_tokens, decode_seqs, "
                         "sum_context, seconds")
    if len(rows) < 4:
        raise ValueError(f"calibrate: need at least 4 measurements, got {len(rows)}")
    if np.any(rows < 0) or np.any(rows[:, 3] <= 0):
        raise ValueError("calibrate: counts must be >= 0 and seconds > 0")
    x = np.column_stack([np.ones(len(rows)), rows[:, :3]])
    coef, report = nonneg_fit(x, rows[:, 3])
    model = StepModel(base_s=float(coef[0]), per_prefill_token_s=float(coef[1]),
                      per_decode_seq_s=float(coef[2]), per_context_token_s=float(coef[3]))
    return model, report


def calibrate(measurements: Iterable[Sequence[float]], template: InstanceProfile,
              name: str | None = None, source: str = "") -> tuple[InstanceProfile, FitReport]:
    """``template`` with its step model fitted to ``measurements`` (limits and cold start kept)."""
    model, report = fit_step_model(measurements)
    note = source or (f"fitted by llmserve.sim.calibrate on {report.n} steps "
                      f"(r2 {report.r2:.3f}, mean abs rel error {report.mean_abs_rel_error:.1%})")
    return replace(template, name=name or template.name, step=model, source=note), report


def read_measurements(path: str | Path) -> list[tuple[float, float, float, float]]:
    """Rows of a CSV with the columns ``prefill_tokens,decode_seqs,sum_context,seconds``."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or not set(COLUMNS) <= set(reader.fieldnames):
            raise ValueError(f"{path}: needs columns {COLUMNS}, got {reader.fieldnames}")
        return [tuple(float(row[c]) for c in COLUMNS) for row in reader]  # type: ignore[misc]
