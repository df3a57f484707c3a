"""PNG plots of simulated runs (matplotlib, Agg backend: no display needed).

Three figures, all policies on each:
- ``load_instances.png``: the arrival rate and each policy's ready instances;
- ``latency.png``: TTFT p99 per interval for each policy, with the SLO;
- ``cost_vs_slo.png``: instance-hours against TTFT SLO attainment, one point per policy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from llmserve.percentiles import percentile  # noqa: E402
from llmserve.sim.results import COMPLETED, SimResult  # noqa: E402
from llmserve.sim.traces import Trace  # noqa: E402

_DPI = 80


def _hours(t: np.ndarray) -> np.ndarray:
    return np.asarray(t) / 3600.0


def plot_load_instances(trace: Trace, results: Sequence[SimResult], path: Path) -> None:
    fig, (ax_load, ax_inst) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    if len(trace.rate_t):
        ax_load.plot(_hours(trace.rate_t), trace.rate_rps, color="0.3", lw=1)
    ax_load.set_ylabel("arrivals (req/s)")
    ax_load.set_title(f"load and instances: {trace.name}")
    for r in results:
        t = r.column("t")
        ax_inst.step(_hours(t), r.column("ready") + r.column("coming"), where="post", lw=1,
                     label=r.summary.policy)
    ax_inst.set_ylabel("instances (ready + coming)")
    ax_inst.set_xlabel("hours")
    ax_inst.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)


def _interval_p99(r: SimResult, bin_s: float) -> tuple[np.ndarray, np.ndarray]:
    ok = r.status == COMPLETED
    t, v = r.arrival_s[ok], r.ttft[ok]
    if not len(t):
        return np.zeros(0), np.zeros(0)
    bins = np.floor(t / bin_s).astype(int)
    out_t, out_v = [], []
    order = np.argsort(bins, kind="stable")
    bins, v = bins[order], v[order]
    edges = np.flatnonzero(np.diff(bins)) + 1
    for chunk_b, chunk_v in zip(np.split(bins, edges), np.split(v, edges)):
        out_t.append((chunk_b[0] + 0.5) * bin_s)
        out_v.append(percentile(chunk_v, 99))
    return np.array(out_t), np.array(out_v)


def plot_latency(results: Sequence[SimResult], path: Path, bin_s: float = 600.0) -> None:
    fig, ax = plt.subplots(figsize=(10, 4))
    for r in results:
        t, p99 = _interval_p99(r, bin_s)
        ax.plot(_hours(t), p99, lw=1, label=r.summary.policy)
    if results:
        ax.axhline(results[0].summary.ttft_slo_s, color="red", ls="--", lw=1, label="TTFT SLO")
    ax.set_yscale("log")
    ax.set_ylabel(f"TTFT p99 per {bin_s / 60:g} min (s)")
    ax.set_xlabel("hours (arrival time)")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)


def plot_cost_vs_slo(results: Sequence[SimResult], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for r in results:
        s = r.summary
        ax.scatter(s.instance_hours, 100 * s.ttft_attainment, s=40)
        ax.annotate(s.policy, (s.instance_hours, 100 * s.ttft_attainment), textcoords="offset points",
                    xytext=(5, 5), fontsize=8)
    ax.axhline(99.0, color="red", ls="--", lw=1)
    ax.set_xlabel("instance-hours")
    ax.set_ylabel("requests within TTFT SLO (%)")
    ax.set_title("cost vs SLO")
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)


def write_plots(trace: Trace, results: Sequence[SimResult], out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "load_instances.png", out / "latency.png", out / "cost_vs_slo.png"]
    plot_load_instances(trace, results, paths[0])
    plot_latency(results, paths[1])
    plot_cost_vs_slo(results, paths[2])
    return paths
