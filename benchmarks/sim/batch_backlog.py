"""Issue 33, item 4: the simulated day with a batch backlog against the same day without it.

The built-in diurnal day (``llmserve simulate --trace diurnal``'s defaults) under the
predictive policy, once as it is and once with a backlog submitted at midnight with
a 24 h window, released by the live batch runner's pacing (``llmserve/sim/batch_backlog.py``).
Reports realtime TTFT SLO attainment and p99, instance-hours and when the batch finished.

    python benchmarks/sim/batch_backlog.py [--lines 20000] [--cold-start 120]

Results: ``benchmarks/results/sim_batch_backlog_<lines>.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from llmserve.gateway.batches.config import BatchShareConfig  # noqa: E402
from llmserve.sim.batch_backlog import Backlog, compare_day  # noqa: E402
from llmserve.sim.cli import add_simulate_args, autoscale_from_args, sim_from_args, trace_from_args  # noqa: E402
from llmserve.sim.compare import initial_instances  # noqa: E402
from llmserve.sim.profile import load_profile  # noqa: E402


def share_from(text: str | None) -> BatchShareConfig | None:
    if not text:
        return BatchShareConfig()
    if text == "off":
        return None
    trough, peak, trough_load, peak_load = text.split(",")
    return BatchShareConfig(trough=int(trough), peak=int(peak), trough_load=float(trough_load),
                            peak_load=float(peak_load))


def day_args(ap: argparse.ArgumentParser) -> None:
    """The day's own options (the rest go to ``llmserve simulate``'s parser)."""
    ap.add_argument("--lines", type=int, default=20_000)
    ap.add_argument("--submit-h", type=float, default=0.0)
    ap.add_argument("--window-h", type=float, default=24.0)
    ap.add_argument("--cold-start", type=float, default=120.0)
    ap.add_argument("--policy-name", default="predictive")
    ap.add_argument("--max-concurrency", type=int, default=64, help="batches.max_concurrency: the widened release's cap")
    ap.add_argument("--share", default=None, metavar="TROUGH,PEAK,TROUGH_LOAD,PEAK_LOAD|off",
                    help="batches.share: lines per ready instance that follow the forecast (default: the config's)")


def setup(own: argparse.Namespace, rest: list[str]):
    """(trace, backlog, profile, autoscale, sim) for the day ``own`` and ``rest`` describe."""
    sp = argparse.ArgumentParser()
    add_simulate_args(sp)
    args = sp.parse_args(["--trace", "diurnal", "--policy", own.policy_name, *rest])
    profile = load_profile(args.profile).with_cold_start(own.cold_start)
    trace = trace_from_args(args)
    autoscale = autoscale_from_args(args, profile, trace).model_copy(update={"policy": own.policy_name})
    sim = sim_from_args(args)
    start = args.initial_instances or initial_instances(trace, 1, autoscale.bounds.min_instances)
    sim = sim.model_copy(update={"initial_instances": start})
    backlog = Backlog(own.lines, own.submit_h * 3600, own.window_h * 3600,
                      int(trace.prompt_tokens.mean()), int(trace.output_tokens.mean()), ceiling=own.max_concurrency,
                      share=share_from(own.share))
    return trace, backlog, profile, autoscale, sim


def main() -> None:
    ap = argparse.ArgumentParser()
    day_args(ap)
    own, rest = ap.parse_known_args()
    trace, backlog, profile, autoscale, sim = setup(own, rest)
    slo = autoscale.slo.ttft_s
    without, withb = compare_day(trace, backlog, profile, autoscale, sim)
    res = {"trace": trace.name, "requests": len(trace), "policy": own.policy_name, "cold_start_s": own.cold_start,
           "ttft_slo_s": slo, "backlog": {**asdict(backlog), "share": backlog.share and backlog.share.model_dump()}, "without": asdict(without), "with": asdict(withb),
           "instance_hours_ratio": withb.instance_hours / without.instance_hours}
    print(json.dumps(res, indent=1))
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    name = f"sim_batch_backlog_{own.lines}{f'_share_{own.share}' if own.share else ''}"
    (out / f"{name}.json").write_text(json.dumps(res, indent=1) + "\n")
    done = "not finished" if withb.batch_done_s is None else f"{withb.batch_done_s / 3600:.2f} h"
    (out / f"{name}.md").write_text(
        f"# Simulated day with a batch backlog\n\n`python benchmarks/sim/batch_backlog.py --lines {own.lines} "
        f"--max-concurrency {own.max_concurrency}{f' --share {own.share}' if own.share else ''}` "
        f"({trace.name}, {len(trace)} realtime requests, {own.policy_name}, cold start {own.cold_start:g} s)\n\n"
        "| | realtime TTFT attainment | realtime TTFT p99 | instance-hours | batch done after |\n|---|---|---|---|---|\n"
        f"| without | {without.realtime_ttft_attainment:.4%} | {without.realtime_ttft_p99_s:.2f} s | "
        f"{without.instance_hours:.2f} | |\n"
        f"| with {own.lines:,} lines at {own.submit_h:g} h, window {own.window_h:g} h | "
        f"{withb.realtime_ttft_attainment:.4%} | {withb.realtime_ttft_p99_s:.2f} s | {withb.instance_hours:.2f} | "
        f"{done} |\n\ninstance-hours ratio {res['instance_hours_ratio']:.3f}\n")


if __name__ == "__main__":
    main()
