#!/bin/bash
# Paired A/B through HTTP of two revisions: `llmserve engine` at its defaults from a worktree of
# BASE (its kernels built into a scratch folder first) against this checkout, taking turns, the
# same prompts for both in a round. On a shared machine this is the measure of a change: both
# sides meet the same minutes of noise, where two separate benchmark runs do not.
#
#   LLMSERVE_NO_VNNI=1 bash benchmarks/engine/revision_ab.sh BASE [ROUNDS] [GGUF] [CONCURRENCIES]
#
# Prints each round's output tok/s per side and concurrency (default "16 64"), then the median
# over the rounds of this / base.
set -euo pipefail
base=${1:?usage: revision_ab.sh BASE [ROUNDS] [GGUF] [CONCURRENCIES]}
rounds=${2:-4}
gguf=${3:-$HOME/.cache/llmserve/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf}
levels=${4:-16 64}
here=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-python}
tmp=$(mktemp -d)
git -C "$here" worktree add -q --detach "$tmp/base" "$base"
trap 'git -C "$here" worktree remove --force "$tmp/base"; rm -rf "$tmp"' EXIT
# (python -m from a folder imports that folder's llmserve first; the base builds its kernels here)
(cd "$tmp/base" && TORCH_EXTENSIONS_DIR="$tmp/ext" "$py" -c "from llmserve.models import kernels; kernels.load()")
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for i in $(seq "$rounds"); do
  order="base this"; [ $((i % 2)) = 0 ] && order="this base"
  for v in $order; do
    dir="$here"; [ "$v" = base ] && dir="$tmp/base"
    (cd "$dir" && TORCH_EXTENSIONS_DIR="$tmp/ext" exec "$py" -m llmserve.cli engine --model "$gguf" --port "$port" \
      --max-num-seqs 64 > "$tmp/$v.log" 2>&1) &
    pid=$!
    for _ in $(seq 240); do curl -sf "127.0.0.1:$port/ready" > /dev/null && break; sleep 0.5; done
    for c in $levels; do
      (cd "$here" && "$py" -m llmserve.bench --base-url "http://127.0.0.1:$port/v1" --endpoint completions \
        --ignore-eos --num-prompts "$c" --max-concurrency "$c" --random-input-len 103 --random-output-len 128 \
        --random-range-ratio 0 --tokenizer "$gguf" --num-warmups 1 --seed $((i * 100 + c)) \
        --save-result "$tmp/r.json" --disable-tqdm > /dev/null)
      tps=$("$py" -c "import json; print(round(json.load(open('$tmp/r.json'))['summary']['output_throughput'], 1))")
      echo "$i $v c=$c $tps" | tee -a "$tmp/all.txt"
    done
    kill "$pid"; wait "$pid" 2> /dev/null || true
  done
done
"$py" - "$tmp/all.txt" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    i, v, c, tps = line.split()
    runs.setdefault(c, {}).setdefault(i, {})[v] = float(tps)
for c, rounds in runs.items():
    ratios = [r["this"] / r["base"] for r in rounds.values() if len(r) == 2]
    print(f"{c}: this / base median {statistics.median(ratios):.3f} over {len(ratios)} rounds "
          f"({', '.join(f'{x:.2f}' for x in ratios)})")
EOF
