"""Speculation through HTTP (issue 37): the copy task against llama.cpp, and text that copies nothing.

    python benchmarks/spec/copy_task.py --llama-server /root/.cache/llama-server-11434/build/bin/llama-server \\
        --gguf ~/.cache/llmserve/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf --threads 2

Servers, all on the same GGUF, started together: llama-server ``-t THREADS``,
``llmserve engine`` at defaults (n-gram speculation on) and ``llmserve engine
--speculative-config none``.

1. Copy task: the answer repeats a given paragraph (chat, ``stream``, temperature 0,
   ``max_tokens`` 120), one stream; each text ``--rounds`` times per server, the order
   of the servers turning each time. Output tokens per second = completion tokens /
   wall time of the request (TTFT included); per server the median over texts of the
   median over rounds, as in the issue.
2. Text that copies nothing: ``llmserve bench`` random prompts (the peers benchmark's:
   103 tokens in, 128 out, ignore_eos) at c = 1 and 16, llmserve with and without
   speculation, alternating.

The table goes to stdout and, with ``--write``, into benchmarks/spec/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "engine"))
sys.path.insert(0, str(HERE.parent / "peers"))
from run import PY, bench, free_port, start, stop, summary, wait_ready  # noqa: E402  (benchmarks/peers/run.py)
from speculative import PROSE  # noqa: E402  (benchmarks/engine/speculative.py)

COPY = "Repeat the following paragraph exactly, word for word, and output nothing else.\n\n"


def stream_chat(url: str, text: str, max_tokens: int) -> dict:
    body = {"model": "m", "messages": [{"role": "user", "content": COPY + text}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first, chunks, usage, out = None, 0, None, []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d.get("usage"):
                usage = d["usage"]
            for c in d.get("choices") or []:
                piece = (c.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    chunks += 1
                    out.append(piece)
    wall = time.perf_counter() - t0
    n = usage["completion_tokens"] if usage else chunks
    return {"tokens": n, "wall": wall, "ttft": (first or t0) - t0, "text": "".join(out)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", help="llama-server binary (leave out: llmserve only)")
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--texts", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=120)
    ap.add_argument("--concurrency", type=int, nargs="*", default=[1, 16], help="random-prompt runs (none: skip)")
    ap.add_argument("--prompts", type=float, default=1.0, help="scale the random runs' prompt counts (8 at c = 1, "
                                                               "32 at c = 16)")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="spec-"))
    engine = [PY, "-m", "llmserve.cli", "engine", "--model", args.gguf, "--max-num-seqs", "64",
              "--served-model-name", "m"]
    ports = [free_port() for _ in range(3)]  # other servers share this machine
    servers = {"llmserve": (engine + ["--port", str(ports[1])], f"http://127.0.0.1:{ports[1]}", "/ready"),
               "llmserve, no speculation": (engine + ["--port", str(ports[2]), "--speculative-config", "none"],
                                            f"http://127.0.0.1:{ports[2]}", "/ready")}
    if args.llama_server:
        servers = {"llama.cpp": ([args.llama_server, "-m", args.gguf, "-np", "16", "-c", "16384", "-t",
                                  str(args.threads), "--port", str(ports[0]), "--host", "127.0.0.1"],
                                 f"http://127.0.0.1:{ports[0]}", "/health"), **servers}
    procs = {n: start(cmd, work / f"{i}.log") for i, (n, (cmd, _, _)) in enumerate(servers.items())}
    names = list(servers)
    copy: dict[str, list[list[float]]] = {n: [] for n in names}
    texts: dict[str, list[str]] = {n: [] for n in names}
    rand: dict[int, dict[str, dict]] = {}
    try:
        for _, url, path in servers.values():
            wait_ready(url, path)
        for _, url, _ in servers.values():
            stream_chat(url, PROSE[-1], 8)  # warm-up
        turn = 0
        for j, text in enumerate(PROSE[:args.texts]):
            per = {n: [] for n in names}
            for _ in range(args.rounds):
                order = names[turn % len(names):] + names[:turn % len(names)]
                turn += 1
                for n in order:
                    r = stream_chat(servers[n][1], text, args.max_tokens)
                    per[n].append(r["tokens"] / r["wall"])
                    texts[n].append(r["text"])
            for n in names:
                copy[n].append(per[n])
            print(f"text {j}: " + ", ".join(f"{n} {statistics.median(per[n]):.1f}" for n in names), flush=True)
        for c in args.concurrency:
            rand[c] = {}
            pair = ["llmserve", "llmserve, no speculation"]
            for n in pair if c % 2 else pair[::-1]:
                out = work / f"rand-{c}-{len(rand[c])}.json"
                cmd = bench(servers[n][1], args.gguf, out, concurrency=c, prompts=max(c, int(args.prompts * {1: 8, 16: 32}.get(c, 2 * c))))
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                rand[c][n] = summary(out)
            print(f"random c={c}: " + ", ".join(f"{n} {s['output_throughput']:.1f} tok/s" for n, s in rand[c].items()),
                  flush=True)
        metrics = httpx.get(servers["llmserve"][1] + "/metrics").text
    finally:
        for p in procs.values():
            stop(p)
    same = texts["llmserve"] == texts["llmserve, no speculation"]
    table = render(copy, rand, names, same, metrics, args)
    print(table)
    if args.write:
        readme = HERE / "README.md"
        head = readme.read_text().split("<!-- results -->")[0]
        readme.write_text(head + "<!-- results -->\n" + table)
    return 0


def render(copy, rand, names, same, metrics, args) -> str:
    load = os.getloadavg()
    med = {n: statistics.median(statistics.median(r) for r in copy[n]) for n in names}
    out = [f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs shared with "
           f"other jobs, load average after the run {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}: ratios within "
           "this run are what counts.", "",
           f"Copy task, one stream, output tok/s (median over rounds per text; {args.rounds} rounds):", "",
           "| text | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for j in range(len(copy[names[0]])):
        out.append(f"| {j} | " + " | ".join(f"{statistics.median(copy[n][j]):.1f}" for n in names) + " |")
    out.append("| **median** | " + " | ".join(f"**{med[n]:.1f}**" for n in names) + " |")
    base = med["llmserve, no speculation"]
    out += ["", f"llmserve at defaults vs without speculation: {med['llmserve'] / base:.2f}x"
                + (f"; vs llama.cpp: {med['llmserve'] / med['llama.cpp']:.2f}x" if "llama.cpp" in med else "")
                + f". Greedy texts identical with and without speculation: {'yes' if same else 'NO'}."]
    if rand:
        out += ["", "Random prompts (103 in, 128 out, ignore_eos; `llmserve bench`), output tok/s:", "",
                "| concurrency | with speculation | without | ratio |", "|---|---|---|---|"]
        for c, r in rand.items():
            a, b = r["llmserve"]["output_throughput"], r["llmserve, no speculation"]["output_throughput"]
            out.append(f"| {c} | {a:.1f} | {b:.1f} | {a / b:.2f}x |")
    spec = [ln for ln in metrics.splitlines() if ln.startswith(("vllm:spec_decode_num_draft", "vllm:spec_decode_num_accepted_tokens_total"))]
    out += ["", "The speculating instance's counters after the run:", "", "```", *spec, "```", "",
            f"`python benchmarks/spec/copy_task.py {' '.join(sys.argv[1:])}`", ""]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
