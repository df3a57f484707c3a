"""The live compressed ramp through ``llmserve serve``: the figures in README.md.

Runs exactly the scenario of ``tests/autoscale/test_live.py`` (same config, same
rate trace, same bench settings) ``--runs`` times and reports, per run:

- time from the load increase (the ramp's start) to the first instance started
  after it taking traffic, split into decision lag and cold start;
- TTFT p50/p99 of the requests sent during the ramp (and the hold at peak);
- instance-seconds used versus a fixed pool sized for the peak, over the load.

    python3 benchmarks/autoscale/live_ramp.py --runs 2 --out benchmarks/autoscale/live_ramp.json

Never part of the test suite: it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.autoscale.test_live import RAMP, figures, live_config, run_ramp  # noqa: E402
from tests.helpers import make_tiny_llama  # noqa: E402


def one_run(seed_dir: Path) -> dict:
    model = make_tiny_llama(seed_dir)
    cfg = live_config(model)
    run = run_ramp(seed_dir, model, cfg)
    try:
        fig = figures(run)
        fig["failed_requests"] = sum(not r.success for r in run["result"].records)
        fig["decisions"] = [(round(d["time"] - run["t0"], 1), d["provisioned"], d["desired"], d["reason"])
                            for d in run["decisions"] if d["time"] >= run["t0"]]
    finally:
        run["serve"].stop()
    return fig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    results = []
    for k in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="llmserve-live-ramp-") as tmp:
            fig = one_run(Path(tmp))
        results.append(fig)
        print(f"run {k + 1}: " + json.dumps({k: v for k, v in fig.items() if k != "decisions"}), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"ramp": RAMP, "runs": results}, indent=2))
    print("\n| run | decision lag (s) | to new instance's traffic (s) | cold starts (s) | TTFT p50 / p99 ramp (s) "
          "| peak ready | instance-s used | fixed peak pool instance-s | saving |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k, f in enumerate(results, 1):
        cold = ", ".join(f"{c:.1f}" for c in f["cold_start_s"])
        saving = 1 - f["instance_seconds"] / f["fixed_peak_pool_instance_seconds"]
        print(f"| {k} | {f['first_scale_up_decision_after_ramp_s']:.1f} | {f['time_to_new_instance_traffic_s']:.1f} "
              f"| {cold} | {f['ttft_p50_ramp_s']:.3f} / {f['ttft_p99_ramp_s']:.3f} | {f['peak_ready']} "
              f"| {f['instance_seconds']:.0f} | {f['fixed_peak_pool_instance_seconds']:.0f} | {saving:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
