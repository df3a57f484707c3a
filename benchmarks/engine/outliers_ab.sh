#!/bin/bash
# Paired A/B through HTTP: `llmserve engine` at its defaults (one-byte activations on every
# kind, outlier channels set aside: llmserve/models/outliers.py) against the same engine with
# no channels set aside (two bytes on qkv and gate_up: the default before), taking turns.
#
#   LLMSERVE_NO_VNNI=1 bash benchmarks/engine/outliers_ab.sh [ROUNDS] [GGUF]
#
# "old" runs with a sitecustomize that empties outliers.CHANNELS in every process of the
# instance; both pin --prefill-weights int8, so the start-up timing of the prefill path
# cannot pick differently for the two. Prints each round's output tok/s at c = 16 and 64.
set -euo pipefail
rounds=${1:-4}
gguf=${2:-$HOME/.cache/llmserve/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf}
site=$(mktemp -d)
out=$(mktemp -d)
trap 'rm -rf "$site" "$out"' EXIT
printf 'import llmserve.models.outliers as o\no.CHANNELS = {}\n' > "$site/sitecustomize.py"
port=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for i in $(seq "$rounds"); do
  for v in old new; do
    if [ "$v" = old ]; then pp="$site"; else pp=""; fi
    PYTHONPATH="$pp" llmserve engine --model "$gguf" --port "$port" --max-num-seqs 64 --prefill-weights int8 \
      > "$out/$v.log" 2>&1 &
    pid=$!
    for _ in $(seq 240); do curl -sf "127.0.0.1:$port/ready" > /dev/null && break; sleep 0.5; done
    for c in 16 64; do
      python -m llmserve.bench --base-url "http://127.0.0.1:$port/v1" --endpoint completions --ignore-eos \
        --num-prompts "$c" --max-concurrency "$c" --random-input-len 103 --random-output-len 128 \
        --random-range-ratio 0 --tokenizer "$gguf" --num-warmups 1 --seed $((i * 100 + c)) \
        --save-result "$out/r.json" --disable-tqdm > /dev/null
      python -c "import json; print('$i $v c=$c', round(json.load(open('$out/r.json'))['summary']['output_throughput'], 1))"
    done
    kill "$pid"; wait "$pid" 2> /dev/null || true
  done
done
