# Does sampling a large pool (issue 35) pick as well as scoring every instance? Same trace, same
# autoscaler; only BalancerConfig.score_all_up_to differs (32, the default: sampled; 10**6: whole pool).
# Usage: sampled_vs_whole.py [PEAK_RPS INSTANCES SECONDS ...] (triples; default 150 60 300 and 240 110 600)
import sys
from llmserve.autoscale import AutoscaleConfig
from llmserve.gateway.balancer import BalancerConfig
from llmserve.sim.profile import load_profile
from llmserve.sim.simulator import SimConfig, Simulator
from llmserve.sim.traces import build_trace

h100 = load_profile("h100-8b").with_cold_start(120.0)
args = [float(a) for a in sys.argv[1:]] or [150, 60, 300, 240, 110, 600]
for rps, n, secs in zip(args[0::3], args[1::3], args[2::3]):
    tr = build_trace("diurnal", seed=0, peak_rps=rps, duration_s=secs, peak_hour=0.04, ratio=1.2)
    cfg = AutoscaleConfig.model_validate({
        "policy": "predictive", "slo": {"e2e_s": 300.0}, "bounds": {"max_instances": 500},
        "predictive": {"capacity_tokens_per_s": h100.saturation_tokens_per_s(300.0, 200.0), "lead_time_s": 140.0}})
    for label, upto in (("sampled (4 of the pool)", 32), ("whole pool scored", 10**6)):
        s = Simulator(tr, h100, cfg, SimConfig(initial_instances=int(n)),
                      balancer=BalancerConfig(score_all_up_to=upto)).run().summary
        print(f"{rps:.0f} req/s, {n:.0f} instances, {secs:.0f} s: {label:24s} {len(tr)} requests  "
              f"TTFT attain {s.ttft_attainment:.4f} p50 {s.ttft_p50_s:.3f} p99 {s.ttft_p99_s:.3f} s  "
              f"e2e p50 {s.e2e_p50_s:.2f} p99 {s.e2e_p99_s:.2f} s  inst-h {s.instance_hours:.2f}  "
              f"cpu {s.cpu_s:.1f} s ({len(tr) / s.cpu_s:,.0f} req/s)", flush=True)
