# Does sampling a large pool (issue 35) pick as well as scoring every instance? Same trace, same
# autoscaler; only BalancerConfig.score_all_up_to differs (the sampled run's, default 32; 10**6: whole pool).
# Usage: sampled_vs_whole.py [--sample-above N] [PEAK_RPS INSTANCES SECONDS ...]
#        (triples; default 150 60 300 and 240 110 600)
import argparse
from llmserve.autoscale import AutoscaleConfig
from llmserve.gateway.balancer import BalancerConfig
from llmserve.sim.profile import load_profile
from llmserve.sim.simulator import SimConfig, Simulator
from llmserve.sim.traces import build_trace

ap = argparse.ArgumentParser()
ap.add_argument("--sample-above", type=int, default=32)
ap.add_argument("runs", nargs="*", type=float, default=[150, 60, 300, 240, 110, 600])
a = ap.parse_args()
h100 = load_profile("h100-8b").with_cold_start(120.0)
for rps, n, secs in zip(a.runs[0::3], a.runs[1::3], a.runs[2::3]):
    tr = build_trace("diurnal", seed=0, peak_rps=rps, duration_s=secs, peak_hour=0.04, ratio=1.2)
    cfg = AutoscaleConfig.model_validate({
        "policy": "predictive", "slo": {"e2e_s": 300.0}, "bounds": {"max_instances": 500},
        "predictive": {"capacity_tokens_per_s": h100.saturation_tokens_per_s(300.0, 200.0), "lead_time_s": 140.0}})
    for label, upto in ((f"sampled above {a.sample_above}", a.sample_above), ("whole pool scored", 10**6)):
        s = Simulator(tr, h100, cfg, SimConfig(initial_instances=int(n)),
                      balancer=BalancerConfig(score_all_up_to=upto)).run().summary
        print(f"{rps:.0f} req/s, {n:.0f} instances, {secs:.0f} s: {label:20s} {len(tr)} requests  "
              f"TTFT attain {s.ttft_attainment:.4f} p50 {s.ttft_p50_s:.3f} p99 {s.ttft_p99_s:.3f} s  "
              f"e2e p50 {s.e2e_p50_s:.2f} p99 {s.e2e_p99_s:.2f} s  inst-h {s.instance_hours:.2f}  peak {s.peak_instances}  "
              f"cpu {s.cpu_s:.1f} s ({len(tr) / s.cpu_s:,.0f} req/s)", flush=True)
