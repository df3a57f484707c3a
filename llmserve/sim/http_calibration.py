"""Fit an instance profile to what a client saw through the HTTP path (pure).

Each observation is one streamed request of a burst of ``concurrency``
simultaneous requests per busy instance (measured by
:mod:`llmserve.fidelity.http_measure`). With one instance busy, the burst is
admitted in one step, so a request's TTFT is that prefill step plus a fixed
request overhead (gateway, API process, tokenising, the engine-process hop, the
first SSE event: latency outside the engine), and its TPOT is one decode step of
``concurrency`` sequences at about half its output::

    TTFT = overhead + a + b * n*p + d * n*p
    TPOT = a + c * n + d * n*(p + o/2)

Both kinds of rows go into one non-negative least-squares fit
(:func:`llmserve.sim.calibrate.nonneg_fit`) with an indicator column for the
overhead. With two instances busy, the ratio of measured TPOT to the one-busy
model's prediction fits the core-sharing ``api_share``
(:func:`llmserve.sim.sharing.fit_api_share`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from llmserve.sim.calibrate import FitReport, nonneg_fit
from llmserve.sim.profile import InstanceProfile, StepModel
from llmserve.sim.sharing import CoreSharing, fit_api_share


@dataclass(frozen=True, slots=True)
class Observation:
    """One request as the client saw it."""

    busy: int  # instances busy at once (each with ``concurrency`` requests)
    concurrency: int
    prompt: int
    output: int
    ttft_s: float
    tpot_s: float

    def __post_init__(self) -> None:
        if min(self.busy, self.concurrency, self.prompt) < 1 or self.output < 2:
            raise ValueError(f"observation: needs busy, concurrency, prompt >= 1 and output >= 2: {self}")
        if not (self.ttft_s > 0 and self.tpot_s > 0):
            raise ValueError(f"observation: TTFT and TPOT must be positive: {self}")


@dataclass(frozen=True, slots=True)
class HttpFit:
    """The fitted profile and how well each half explains its rows."""

    profile: InstanceProfile
    report: FitReport
    sharing_ratio: float  # median TPOT with two busy against the one-busy model; NaN when unmeasured


def design(obs: Sequence[Observation]) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``[1, prefill, decode_seqs, context, is_ttft]`` and seconds: a TTFT and a TPOT row per point.

    A point is one (concurrency, prompt, output); its rows hold the medians of its
    requests, so a burst of four weighs no more than a single request (a trace at
    modest load is mostly the latter) and one stalled request does not pull the fit.
    """
    points: dict[tuple[int, int, int], list[Observation]] = {}
    for o in obs:
        points.setdefault((o.concurrency, o.prompt, o.output), []).append(o)
    x, y = [], []
    for (n, p, out), group in sorted(points.items()):
        x.append([1.0, n * p, 0.0, n * p, 1.0])
        y.append(float(np.median([o.ttft_s for o in group])))
        x.append([1.0, 0.0, n, n * (p + out / 2), 0.0])
        y.append(float(np.median([o.tpot_s for o in group])))
    return np.asarray(x, dtype=float), np.asarray(y, dtype=float)


def decode_step(step: StepModel, o: Observation) -> float:
    """The one-busy model's TPOT for an observation's burst."""
    n = o.concurrency
    return step.step_time(0, n, int(n * (o.prompt + o.output / 2)))


def fit_http(obs: Sequence[Observation], template: InstanceProfile, cores: int, threads: int) -> HttpFit:
    """``template`` with its step model, request overhead and core sharing fitted to ``obs``."""
    alone = [o for o in obs if o.busy == 1]
    if len({(o.concurrency, o.prompt) for o in alone}) < 3:
        raise ValueError("http calibration: need one-busy observations at 3 or more (concurrency, prompt) points")
    coef, report = nonneg_fit(*design(alone))
    step = StepModel(base_s=float(coef[0]), per_prefill_token_s=float(coef[1]),
                     per_decode_seq_s=float(coef[2]), per_context_token_s=float(coef[3]))
    shared = [o for o in obs if o.busy > 1]
    ratio = float("nan")
    sharing = CoreSharing(cores, threads)
    if shared:
        busy = max(o.busy for o in shared)
        ratios = [o.tpot_s / decode_step(step, o) for o in shared if o.busy == busy]
        ratio = float(np.median(ratios))
        sharing = CoreSharing(cores, threads, fit_api_share(cores, threads, busy, ratios))
    note = (f"fitted by llmserve.sim.http_calibration to {len(alone)} requests through HTTP at "
            f"{report.n // 2} points "
            f"(r2 {report.r2:.3f}, mean abs rel error {report.mean_abs_rel_error:.1%}); core sharing from "
            + (f"{len(shared)} requests with {max(o.busy for o in shared)} busy (TPOT ratio {ratio:.2f})"
               if shared else "threads against cores alone (not measured)"))
    profile = replace(template, step=step, request_overhead_s=float(coef[4]), sharing=sharing, source=note)
    return HttpFit(profile, report, ratio)
