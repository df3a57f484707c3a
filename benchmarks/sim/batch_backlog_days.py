"""Issue 33, item 4, over several simulated days: the backlog's cost as a mean, not one day's draw.

One day says little: a burst episode at the peak (100 to 250 realtime misses in an
hour, with or without a batch) lands or not on details, so adding one line to an
8,000-line backlog moves a day's realtime attainment by up to 0.7 points and its
instance-hours by up to 3 % (``benchmarks/sim/README.md``, session 17). This runs
``batch_backlog.py``'s day (same options) once alone and once with the backlog for each
``--seeds`` (the trace's noise and draws), one simulation at a time, and prints each day
and the mean gap.

    python benchmarks/sim/batch_backlog_days.py --lines 8000 --seeds 0-7

Results: ``benchmarks/results/sim_batch_backlog_days_<lines>.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from batch_backlog import day_args, setup  # noqa: E402
from llmserve.sim.batch_backlog import compare_day  # noqa: E402


def seeds_from(text: str) -> list[int]:
    """``0-7`` or ``0,1,5``."""
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(x) for x in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser()
    day_args(ap)
    ap.add_argument("--seeds", default="0-7")
    own, rest = ap.parse_known_args()
    rows = []
    for seed in seeds_from(own.seeds):
        trace, backlog, profile, autoscale, sim = setup(own, ["--seed", str(seed), *rest])
        alone, withb = compare_day(trace, backlog, profile, autoscale, sim)
        gap = (withb.realtime_ttft_attainment - alone.realtime_ttft_attainment) * 100
        ratio = withb.instance_hours / alone.instance_hours - 1
        done = "not finished" if withb.batch_done_s is None else f"{withb.batch_done_s / 3600:.1f} h"
        met = gap >= 0 and ratio <= 0.05 and withb.batch_done_s is not None
        line = (f"| {seed} | {alone.realtime_ttft_attainment:.3%} | {alone.instance_hours:.1f} | "
                f"{withb.realtime_ttft_attainment:.3%} | {gap:+.3f} pt | {withb.instance_hours:.1f} | "
                f"{ratio:+.1%} | {done} | {'yes' if met else 'no'} |")
        print(line, flush=True)
        rows.append((gap, ratio, met, line))
    n = len(rows)
    mean = (f"mean over {n} days: attainment {sum(r[0] for r in rows) / n:+.3f} pt, instance-hours "
            f"{sum(r[1] for r in rows) / n:+.2%}; target met on {sum(r[2] for r in rows)} of {n}")
    print(mean)
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    (out / f"sim_batch_backlog_days_{own.lines}.md").write_text(
        f"# Simulated days with a batch backlog\n\n`python benchmarks/sim/batch_backlog_days.py --lines {own.lines} "
        f"--seeds {own.seeds}{' ' + ' '.join(rest) if rest else ''}`\n\n"
        "| seed | alone attainment | alone instance-hours | with attainment | gap | with instance-hours | vs alone "
        "| batch done after | target met |\n|---|---|---|---|---|---|---|---|---|\n"
        + "\n".join(r[3] for r in rows) + f"\n\n{mean}\n")


if __name__ == "__main__":
    main()
