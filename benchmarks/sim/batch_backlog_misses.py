"""Where the realtime misses of the batch-backlog day come from (issue 33's diagnosis).

The day of ``batch_backlog.py`` with each realtime request's gateway wait (arrival to
delivery) and the batch rows on the instance it was delivered to; prints the misses
by hour, how many waited past the SLO at the gateway, the pool and the capacity
estimate by hour. ``--reserve`` and ``--base`` try other ``concurrency.realtime_reserve``
and ``batches.concurrency`` values.

    python benchmarks/sim/batch_backlog_misses.py [--lines 20000] [--reserve 0.25] [--base 2] [--alone]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from llmserve.gateway.admission import ConcurrencyConfig  # noqa: E402
from llmserve.sim.batch_backlog import Backlog, BacklogSimulator  # noqa: E402
from llmserve.sim.cli import add_simulate_args, autoscale_from_args, sim_from_args, trace_from_args  # noqa: E402
from llmserve.sim.compare import initial_instances  # noqa: E402
from llmserve.sim.profile import load_profile  # noqa: E402
from llmserve.sim.results import COMPLETED  # noqa: E402


class Recorded(BacklogSimulator):
    """Records each delivery's time and the batch rows already on its instance, and the capacity estimate."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.delivered = np.full(len(self.status), np.nan)
        self.batch_rows = np.zeros(len(self.status))
        self.estimates: list[tuple[float, float]] = []

    def _deliver(self, rid, inst, now):
        self.delivered[rid] = now
        self.batch_rows[rid] = sum(1 for q in (*inst.running.values(), *inst.waiting) if self._priority[q.rid] > 0)
        super()._deliver(rid, inst, now)

    def _tick(self, now, state):
        out = super()._tick(now, state)
        inner = getattr(out, "inner", None)
        if inner is not None and hasattr(inner, "capacity"):
            self.estimates.append((now, inner.capacity.tokens_per_s))
        return out


def by_hour(pairs) -> list[float]:
    hours = collections.defaultdict(list)
    for t, v in pairs:
        hours[int(t // 3600)].append(v)
    return [round(float(np.mean(hours[h])), 1) for h in sorted(hours)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=20_000)
    ap.add_argument("--reserve", type=float, default=0.25)
    ap.add_argument("--base", type=int, default=2)
    ap.add_argument("--alone", action="store_true", help="the day without the backlog")
    own, rest = ap.parse_known_args()
    sp = argparse.ArgumentParser()
    add_simulate_args(sp)
    args = sp.parse_args(["--trace", "diurnal", "--policy", "predictive", *rest])
    profile = load_profile(args.profile).with_cold_start(120.0)
    trace = trace_from_args(args)
    autoscale = autoscale_from_args(args, profile, trace).model_copy(update={"policy": "predictive"})
    sim = sim_from_args(args)
    sim = sim.model_copy(update={"initial_instances": initial_instances(trace, 1, autoscale.bounds.min_instances)})
    lines = 0 if own.alone else own.lines
    backlog = Backlog(lines, 0.0, 24 * 3600.0, int(trace.prompt_tokens.mean()), int(trace.output_tokens.mean()),
                      base=own.base)
    d = Recorded(trace, backlog, profile, autoscale, sim, concurrency=ConcurrencyConfig(realtime_reserve=own.reserve))
    res = d.run()
    slo = autoscale.slo.ttft_s
    rt = ~d.is_line
    arrival = np.asarray(d._arrival)
    miss = rt & ~((res.status == COMPLETED) & (np.nan_to_num(res.ttft, nan=np.inf) <= slo))
    waited = d.delivered - arrival > slo
    done = f", batch done after {d.done_at / 3600:.2f} h" if lines else ""
    print(f"realtime TTFT attainment {1 - miss.sum() / rt.sum():.4%}, instance-hours "
          f"{res.summary.instance_hours:.1f}{done}")
    print(f"misses {miss.sum()}: {np.sum(miss & waited)} waited past the SLO at the gateway")
    print("misses by hour", np.bincount((arrival[miss] // 3600).astype(int), minlength=24).tolist())
    print(f"batch rows on the instance at a realtime delivery: mean {np.nanmean(d.batch_rows[rt]):.2f}")
    print("instances by hour", by_hour((r.t, r.ready + r.coming + r.draining) for r in d.timeline))
    print("capacity estimate by hour (tokens/s)", by_hour(d.estimates))


if __name__ == "__main__":
    main()
