"""The fidelity check's arithmetic: one side's figures, and live set against simulated.

A live run and a simulated run of the same trace are reduced to the same
:class:`SideFigures` by the same function, from the same kinds of raw data:
per-request latencies, the instances' spans (start to stop) and the scaling
decisions that changed the count. Everything is counted over the same window,
the trace's duration from its first arrival slot; latency percentiles are
numpy's linear ones over the completed requests, as in the simulator's table.
Pure: the orchestration that produces the inputs is in
:mod:`llmserve.fidelity.fidelity_check`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from rich.table import Table

from llmserve.autoscale.usage import Span, held_seconds, peak_held
from llmserve.sim.results import percentile


@dataclass(frozen=True, slots=True)
class SideFigures:
    """What one side (live or simulated) did with the trace."""

    requests: int
    completed: int
    failed: int
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    e2e_p50_s: float
    e2e_p99_s: float
    tpot_p50_s: float
    instance_seconds: float
    peak_instances: int
    scale_ups: int
    scale_downs: int

    def as_dict(self) -> dict:
        return asdict(self)


def side_figures(ttft_s: Sequence[float], e2e_s: Sequence[float], output_tokens: Sequence[int],
                 spans: Sequence[Span], changes: Sequence[tuple[float, int, int]],
                 window: tuple[float, float]) -> SideFigures:
    """One side's figures.

    ``ttft_s``, ``e2e_s`` and ``output_tokens`` hold one entry per request of the
    trace, latencies NaN for a request that did not complete; ``spans`` are the
    instances' ``(start, end)``; ``changes`` the decisions ``(time, count before,
    count after)`` that changed the count. Instances, peak and decisions are
    counted within ``window``. TPOT is ``(e2e - TTFT) / (output_tokens - 1)`` over
    requests with more than one output token: the time per step a request saw.
    """
    ttft = np.asarray(ttft_s, dtype=float)
    e2e = np.asarray(e2e_s, dtype=float)
    out = np.asarray(output_tokens, dtype=float)
    if not ttft.shape == e2e.shape == out.shape:
        raise ValueError("fidelity: ttft, e2e and output_tokens need one entry per request")
    t0, t1 = window
    if not t1 >= t0:
        raise ValueError(f"fidelity: window ends before it starts: {window}")
    completed = int(np.sum(~np.isnan(e2e)))
    multi = out > 1
    tpot = (e2e[multi] - ttft[multi]) / (out[multi] - 1)
    inside = [(after - before) for t, before, after in changes if t0 <= t <= t1]
    return SideFigures(
        requests=len(e2e), completed=completed, failed=len(e2e) - completed,
        ttft_p50_s=percentile(ttft, 50), ttft_p90_s=percentile(ttft, 90), ttft_p99_s=percentile(ttft, 99),
        e2e_p50_s=percentile(e2e, 50), e2e_p99_s=percentile(e2e, 99), tpot_p50_s=percentile(tpot, 50),
        instance_seconds=held_seconds(spans, t0, t1), peak_instances=peak_held(spans, t0, t1),
        scale_ups=sum(1 for d in inside if d > 0), scale_downs=sum(1 for d in inside if d < 0))


# (label, SideFigures field, format of a value)
METRICS: tuple[tuple[str, str, str], ...] = (
    ("requests completed", "completed", "{:.0f}"),
    ("requests failed", "failed", "{:.0f}"),
    ("TTFT p50", "ttft_p50_s", "{:.3f}s"),
    ("TTFT p90", "ttft_p90_s", "{:.3f}s"),
    ("TTFT p99", "ttft_p99_s", "{:.3f}s"),
    ("e2e p50", "e2e_p50_s", "{:.2f}s"),
    ("e2e p99", "e2e_p99_s", "{:.2f}s"),
    ("TPOT p50", "tpot_p50_s", "{:.4f}s"),
    ("instance-seconds", "instance_seconds", "{:.1f}"),
    ("peak instances", "peak_instances", "{:.0f}"),
    ("scale-ups", "scale_ups", "{:.0f}"),
    ("scale-downs", "scale_downs", "{:.0f}"),
)


@dataclass(frozen=True, slots=True)
class Row:
    """One metric, live against simulated."""

    metric: str
    key: str
    fmt: str
    live: float
    sim: float

    @property
    def difference(self) -> float:
        return self.sim - self.live

    @property
    def relative(self) -> float:
        """``(sim - live) / live``; 0 when both are 0, NaN when only live is 0 or either is NaN."""
        if math.isnan(self.live) or math.isnan(self.sim):
            return math.nan
        if self.live == 0:
            return 0.0 if self.sim == 0 else math.nan
        return (self.sim - self.live) / abs(self.live)

    def as_dict(self) -> dict:
        return {"metric": self.metric, "key": self.key, "live": self.live, "sim": self.sim,
                "difference": self.difference, "relative": self.relative}

    def cells(self) -> list[str]:
        def show(v: float, fmt: str) -> str:
            return "-" if math.isnan(v) else fmt.format(v)

        diff_fmt = "{:+" + self.fmt[2:]
        rel = self.relative
        return [self.metric, show(self.live, self.fmt), show(self.sim, self.fmt),
                show(self.difference, diff_fmt), "-" if math.isnan(rel) else f"{rel:+.0%}"]


def compare(live: SideFigures, sim: SideFigures) -> list[Row]:
    """Every metric of :data:`METRICS`, live beside simulated."""
    return [Row(label, key, fmt, float(getattr(live, key)), float(getattr(sim, key))) for label, key, fmt in METRICS]


HEADERS = ("metric", "live", "sim", "sim − live", "relative")


def table(rows: Sequence[Row], title: str = "") -> Table:
    t = Table(title=title or None)
    for h in HEADERS:
        t.add_column(h, justify="left" if h == "metric" else "right")
    for r in rows:
        t.add_row(*r.cells())
    return t


def markdown(rows: Sequence[Row]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|---|" + "---:|" * (len(HEADERS) - 1)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join(lines) + "\n"
