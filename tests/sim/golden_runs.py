"""The runs whose outcomes the speed-up must not change, and their fingerprint.

``python -m tests.sim.golden_runs`` writes ``tests/sim/golden/outcomes.json``
from the code as it is; ``test_golden_outcomes`` re-runs the same cases and
compares. The golden was first written by the simulator before its speed-up.
A fingerprint keeps every decision (scale events, instance lifetimes, the
timeline) and every request's outcome (status, TTFT, e2e) exactly, as hashes
of the arrays' bytes plus the summary's numbers.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from llmserve.autoscale import AutoscaleConfig
from llmserve.sim.profile import load_profile
from llmserve.sim.simulator import SimConfig, Simulator
from llmserve.sim.traces import build_trace

GOLDEN = Path(__file__).parent / "golden" / "outcomes.json"
_VOLATILE = {"wall_s", "cpu_s"}


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def cases() -> dict[str, Simulator]:
    h100 = load_profile("h100-8b").with_cold_start(120.0)
    cpu = load_profile("cpu-smollm2").with_cold_start(30.0)
    day = build_trace("diurnal", seed=3, peak_rps=12.0, duration_s=2400.0, ratio=4.0, peak_hour=0.75, batch_fraction=0.2)
    slow = build_trace("diurnal", seed=5, peak_rps=0.3, duration_s=1800.0, ratio=3.0, peak_hour=0.25)
    out: dict[str, Simulator] = {}
    for policy in ("threshold", "kpa", "predictive"):
        cfg = AutoscaleConfig.model_validate({
            "policy": policy, "slo": {"e2e_s": 300.0}, "bounds": {"max_instances": 50},
            "predictive": {"capacity_tokens_per_s": h100.saturation_tokens_per_s(300.0, 200.0),
                           "lead_time_s": 140.0}})
        out[f"h100-{policy}"] = Simulator(day, h100, cfg, SimConfig(initial_instances=1, seed=1), label=policy)
    spot = AutoscaleConfig.model_validate({"policy": "threshold", "slo": {"e2e_s": 300.0},
                                           "bounds": {"max_instances": 50},
                                           "capacity": {"spot": {"max_instances": 20}}})
    out["h100-spot"] = Simulator(day, h100, spot, SimConfig(initial_instances=1, seed=2, reclaim_rate_per_h=2.0),
                                 label="spot")
    shared = AutoscaleConfig.model_validate({"policy": "kpa", "slo": {"e2e_s": 300.0},
                                             "bounds": {"max_instances": 4}})
    out["cpu-kpa"] = Simulator(slow, cpu, shared, SimConfig(initial_instances=1), label="cpu")
    return out


def fingerprint(sim: Simulator) -> dict:
    res = sim.run()
    summary = {k: v for k, v in res.summary.as_dict().items() if k not in _VOLATILE}
    return {"summary": json.loads(json.dumps(summary)),
            "status": _sha(res.status.astype(np.int8)), "ttft": _sha(res.ttft.astype(np.float64)),
            "e2e": _sha(res.e2e.astype(np.float64)), "timeline": _sha(res.timeline.astype(np.float64)),
            "events": [list(e) for e in res.events],
            "lifetimes": [[a, b] for a, b in sorted(res.lifetimes, key=lambda x: (x[0], x[1] or 0.0))]}


def main() -> int:
    data = {name: fingerprint(sim) for name, sim in cases().items()}
    GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}: {sorted(data)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
