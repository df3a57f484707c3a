# Simulated req/s (CPU) of one predictive run; run with PYTHONPATH at an old checkout for "before" (issue 35).
import sys, time
from llmserve.autoscale import AutoscaleConfig
from llmserve.sim.profile import load_profile
from llmserve.sim.simulator import SimConfig, Simulator
from llmserve.sim.traces import build_trace
h100 = load_profile("h100-8b").with_cold_start(120.0)
tr = build_trace("diurnal", seed=0, peak_rps=20.0, duration_s=1800.0, peak_hour=0.25)
cfg = AutoscaleConfig.model_validate({"policy": "predictive", "slo": {"e2e_s": 300.0}, "bounds": {"max_instances": 500},
    "predictive": {"capacity_tokens_per_s": h100.saturation_tokens_per_s(300.0, 200.0), "lead_time_s": 140.0}})
r = Simulator(tr, h100, cfg, SimConfig(initial_instances=2)).run()
s = r.summary
print(sys.argv[1], len(tr), f"wall {s.wall_s:.1f}s cpu {s.cpu_s:.1f}s  {len(tr)/s.cpu_s:,.0f} req/s CPU", s.ttft_attainment, s.instance_hours)
