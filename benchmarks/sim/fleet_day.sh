#!/usr/bin/env bash
# Simulated requests per second on a diurnal day at fleet scale (issue 35).
# Usage: benchmarks/sim/fleet_day.sh PEAK_RPS POLICIES JOBS OUTDIR
# peak 20 req/s: ~0.94 M requests a day; peak 200: ~9.4 M. /usr/bin/time gives wall and peak RSS.
set -euo pipefail
peak=${1:-20}; policies=${2:-predictive}; jobs=${3:-1}; out=${4:-/tmp/fleet-day}
/usr/bin/time -f "wall %e s, max RSS %M KB" llmserve simulate --trace diurnal --policy "$policies" \
  --profile h100-8b --peak-rps "$peak" --max-instances 500 --cold-start 120 --static-instances 60 \
  --jobs "$jobs" --no-plots --no-progress --out "$out"
python - "$out/summary.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["runs"]:
    print(f"{r['policy']}: {r['requests']} requests in {r['wall_s']:.1f} s wall ({r['cpu_s']:.1f} s CPU): "
          f"{r['requests'] / r['wall_s']:,.0f} req/s wall, {r['requests'] / r['cpu_s']:,.0f} req/s CPU")
PY
