# 5 minutes at ~150 req/s over 60+ H100 instances: where the time goes at fleet scale (issue 35).
# Usage: fleet_peak.py LABEL [PEAK_RPS INSTANCES SECONDS] (defaults 150 60 300); CPU time is the figure.
import sys, time
from llmserve.autoscale import AutoscaleConfig
from llmserve.sim.profile import load_profile
from llmserve.sim.simulator import SimConfig, Simulator
from llmserve.sim.traces import build_trace
h100 = load_profile("h100-8b").with_cold_start(120.0)
rps, n, secs = (float(a) for a in (sys.argv[2:5] if len(sys.argv) > 4 else (150, 60, 300)))
tr = build_trace("diurnal", seed=0, peak_rps=rps, duration_s=secs, peak_hour=0.04, ratio=1.2)
cfg = AutoscaleConfig.model_validate({"policy": "predictive", "slo": {"e2e_s": 300.0}, "bounds": {"max_instances": 500},
    "predictive": {"capacity_tokens_per_s": h100.saturation_tokens_per_s(300.0, 200.0), "lead_time_s": 140.0}})
r = Simulator(tr, h100, cfg, SimConfig(initial_instances=int(n))).run()
s = r.summary
print(sys.argv[1], len(tr), f"wall {s.wall_s:.1f}s cpu {s.cpu_s:.1f}s  {len(tr)/s.cpu_s:,.0f} req/s CPU", s.ttft_attainment, s.instance_hours)
