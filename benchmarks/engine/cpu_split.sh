#!/usr/bin/env bash
# Where a c = 64 run's CPU goes through HTTP: each server process's CPU seconds over one
# `llmserve bench` run (64 prompts of 103 tokens, 128 out), and the client's own.
#
#   bash benchmarks/engine/cpu_split.sh engine|serve [GGUF]
#
# On two cores every second another process takes is a second a kernel thread waits for:
# this says how many there are (the engine core's own, the API process's, the gateway's
# with `serve`, the client's). Run as the peers benchmark runs the servers (defaults).
set -euo pipefail
cd "$(dirname "$0")/../.."
mode="${1:?engine or serve}"
gguf="${2:-$HOME/.cache/llmserve/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf}"
py="${PYTHON:-.venv/bin/python}"
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
extra=()
[ "$mode" = engine ] && extra=(--max-num-seqs 64)
log=$(mktemp)
"$py" -m llmserve.cli "$mode" --model "$gguf" --port "$port" "${extra[@]}" > "$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -f "$log"' EXIT
ready() { curl -sf "127.0.0.1:$port/ready" > /dev/null 2>&1; }
for _ in $(seq 1 300); do ready || ! kill -0 "$server" 2>/dev/null && break; sleep 1; done
ready || { echo "the server did not become ready:" >&2; cat "$log" >&2; exit 1; }
bench() {
  "$py" -m llmserve.bench --base-url "http://127.0.0.1:$port/v1" --endpoint completions --ignore-eos \
    --random-input-len 103 --random-range-ratio 0 --tokenizer "$gguf" --disable-tqdm "$@"
}
bench --num-prompts 16 --max-concurrency 16 --random-output-len 32 --seed 5 > /dev/null  # warm-up
tree() {  # the server and every process below it
  echo "$1"
  for c in $(pgrep -P "$1"); do tree "$c"; done
}
cpu() {  # "pid CPU-seconds command" of each of the server's processes
  for p in $(tree "$server"); do
    [ -r "/proc/$p/stat" ] && echo "$p $(awk '{print ($14 + $15) / 100}' "/proc/$p/stat") $(tr '\0' ' ' < "/proc/$p/cmdline" | cut -c1-70)"
  done
}
before=$(cpu)
export -f bench
export port gguf py
client=$( { /usr/bin/time -f "client: %U s user, %S s system CPU (its start and tokenizer included), %e s wall" \
  bash -c 'bench --num-prompts 64 --max-concurrency 64 --random-output-len 128 --seed 3000' > /dev/null; } 2>&1 )
after=$(cpu)
echo "$client"
BEFORE="$before" AFTER="$after" "$py" - <<'PY'
import os
before = {line.split()[0]: float(line.split()[1]) for line in os.environ["BEFORE"].splitlines() if line}
for line in os.environ["AFTER"].splitlines():
    pid, seconds, *cmd = line.split()
    if pid in before:
        print(f"pid {pid}: {float(seconds) - before[pid]:6.2f} s CPU  {' '.join(cmd)}")
PY
