"""Resident memory of one engine, without its KV pool, against llama-server on the same GGUF.

    python benchmarks/engine/memory.py [--llama-server PATH]

Each engine variant starts in a fresh process (``--child``): imports, then the engine
(int8 default, int8 ``exact_activations``, fp32), with a 2,048-token KV pool (llama-server's
``-c 2048``), then one greedy request of 16 tokens; VmRSS (and its anonymous / file
parts) from /proc/self/status at each point, and the pool's resident pages subtracted
(``mincore`` is not needed: the pool is lazily zeroed, so at most the touched blocks count,
reported beside). llama-server starts with ``-c 2048 -np 1 -t 1``; its VmRSS is read after
a first completion request.

Writes benchmarks/results/memory.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
LLAMA_SERVER = Path.home() / ".cache/llama-server-11434/build/bin/llama-server"
GGUF = Path.home() / ".cache/llmserve/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
VARIANTS = {"int8 (default)": {"dtype": "int8"}, "int8, lean (--prefill-weights int8)":
            {"dtype": "int8", "prefill_weights": "int8"},
            "int8, exact activations": {"dtype": "int8", "exact_activations": True}, "fp32": {"dtype": "fp32"}}


def status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS, RssAnon, RssFile in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


def child(variant: str) -> dict:
    points = {}
    import torch

    points["imports"] = status()
    from llmserve import LLM, SamplingParams

    torch.set_num_threads(1)
    llm = LLM(str(GGUF), max_num_seqs=1, num_kv_blocks=128, block_size=16, **VARIANTS[variant])
    points["engine built"] = status()
    llm.generate([list(range(100, 116))], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    points["after a first request"] = status()
    touched = 2 * 32 * llm.engine.model_config.kv_bytes_per_token(2 if llm.engine.config.kv_cache_dtype == "fp16" else 4)
    return {"variant": variant, "points": points, "kv_pool_bytes": 128 * 16 * llm.engine.model_config.kv_bytes_per_token(
        2 if llm.engine.config.kv_cache_dtype == "fp16" else 4), "kv_touched_bytes_at_most": touched}


def llama_server(path: Path) -> dict:
    port = 18000 + os.getpid() % 1000
    cmd = [str(path), "-m", str(GGUF), "-c", "2048", "-np", "1", "-t", "1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        body = json.dumps({"prompt": "Hello", "n_predict": 16, "temperature": 0}).encode()
        for _ in range(240):
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body,
                                             {"Content-Type": "application/json"})
                urllib.request.urlopen(req, timeout=30).read()
                break
            except OSError:
                time.sleep(0.5)
        return {"command": " ".join(cmd), "points": {"after a first request": status(proc.pid)}}
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", default=None)
    ap.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    rows = [json.loads(subprocess.run([sys.executable, __file__, "--child", v], capture_output=True, text=True,
                                      check=True).stdout.strip().splitlines()[-1]) for v in VARIANTS]
    ref = llama_server(args.llama_server) if args.llama_server.is_file() else None
    mb = 1e6
    lines = ["`python benchmarks/engine/memory.py`: SmolLM2-135M-Instruct Q4_1, one engine per fresh process, "
             "KV pool of 2,048 tokens (lazily zeroed; its resident pages after the request are at most the "
             "touched blocks, shown), one 16-token prompt + 16 tokens. MB = 10^6 bytes.", "",
             "| process | RSS after imports | RSS, engine built | RSS after a first request | of which anon / file "
             "| KV pages touched (at most) |", "|---|---|---|---|---|---|"]
    for r in rows:
        p = r["points"]
        last = p["after a first request"]
        lines.append(f"| llmserve, {r['variant']} | {p['imports']['VmRSS'] / mb:.0f} MB | "
                     f"{p['engine built']['VmRSS'] / mb:.0f} MB | {last['VmRSS'] / mb:.0f} MB | "
                     f"{last['RssAnon'] / mb:.0f} / {last['RssFile'] / mb:.0f} MB | {r['kv_touched_bytes_at_most'] / mb:.1f} MB |")
    if ref:
        last = ref["points"]["after a first request"]
        lines.append(f"| llama-server (`{ref['command'].replace(str(Path.home()), '~')}`) | | | "
                     f"{last['VmRSS'] / mb:.0f} MB | {last['RssAnon'] / mb:.0f} / {last['RssFile'] / mb:.0f} MB | |")
    out = ROOT / "benchmarks" / "results"
    (out / "memory.json").write_text(json.dumps({"llmserve": rows, "llama_server": ref}, indent=2))
    (out / "memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
