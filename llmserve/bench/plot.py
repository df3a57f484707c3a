"""A PNG of one run: latency distributions and throughput over time.

Uses matplotlib's object API with the Agg canvas, never pyplot, so plotting needs
no display and leaves no global figure state behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from llmserve.bench import metrics
from llmserve.bench.records import RequestRecord


def _cdf(ax, values_s: Sequence[float], label: str) -> None:
    if len(values_s) == 0:
        return
    ms = np.sort(np.asarray(values_s)) * 1000.0
    ax.plot(ms, np.arange(1, len(ms) + 1) / len(ms), label=label)


def plot_result(records: Sequence[RequestRecord], path: str | Path, title: str = "") -> Path:
    ok = [r for r in records if r.success]
    fig = Figure(figsize=(13, 8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2)
    ax = axes[0][0]
    _cdf(ax, [metrics.ttft(r) for r in ok], "TTFT")
    _cdf(ax, [metrics.e2el(r) for r in ok], "e2e latency")
    ax.set(xlabel="ms", ylabel="share of requests", title="Request latency (CDF)")
    if ok:
        ax.set_xscale("log")
    ax.legend(loc="lower right")
    ax = axes[0][1]
    _cdf(ax, [t for r in ok if (t := metrics.tpot(r)) is not None], "TPOT")
    _cdf(ax, [g for r in ok for g in metrics.itls(r)], "ITL")
    ax.set(xlabel="ms", ylabel="share", title="Per-token latency (CDF)")
    ax.legend(loc="lower right")

    times, tok_s, req_s = metrics.throughput_timeline(records)
    ax = axes[1][0]
    ax.plot(times, tok_s, drawstyle="steps-post", label="output tok/s")
    ax.set(xlabel="time since start (s)", ylabel="output tokens/s", title="Throughput over time")
    ax2 = ax.twinx()
    ax2.plot(times, req_s, drawstyle="steps-post", color="tab:orange", label="completed req/s")
    ax2.set_ylabel("completed requests/s")
    ax = axes[1][1]
    starts = np.sort([r.start_s for r in records])
    ax.plot(starts, np.arange(1, len(starts) + 1), drawstyle="steps-post", label="sent")
    fails = np.sort([r.start_s for r in records if not r.success])
    if len(fails):
        ax.plot(fails, np.arange(1, len(fails) + 1), drawstyle="steps-post", color="tab:red", label="failed")
    ax.set(xlabel="time since start (s)", ylabel="requests", title="Requests sent (cumulative)")
    ax.legend(loc="upper left")
    if title:
        fig.suptitle(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path
