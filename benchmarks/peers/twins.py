"""How far apart two servers measure when they should not: the noise under a paired ratio.

    python benchmarks/peers/twins.py --gguf GGUF                 # engine against engine (A/A)
    python benchmarks/peers/twins.py --gguf GGUF --b serve       # serve against engine (B/A)

Each set starts A (`llmserve engine`) and B (another `llmserve engine`, or `llmserve serve`
at its defaults) on the same GGUF, then benches them in turn, ``--pairs`` times
(c = 16, 32 prompts of 103 tokens, 128 out, as ``run.py``), alternating who goes first and
drawing fresh prompts for every run; both are stopped before the next set starts new ones.
It prints B / A for every pair and the median of each set. An A/A set's spread is what
one paired run of ``run.py`` can resolve; a set's median apart from 1 in an A/A run says
that a process's speed is partly its own, so ratios need several sets of fresh processes.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from run import PY, bench, free_port, start, stop, summary, wait_ready


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--b", choices=["engine", "serve"], default="engine", help="the second server (default: engine)")
    ap.add_argument("--sets", type=int, default=3, help="fresh pairs of processes")
    ap.add_argument("--pairs", type=int, default=3, help="paired runs a set")
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="twins-"))
    seed, medians = 7000, []
    for k in range(args.sets):
        ports = {"A": free_port(), "B": free_port()}
        kinds = {"A": "engine", "B": args.b}
        procs = {n: start([PY, "-m", "llmserve.cli", kinds[n], "--model", args.gguf, "--port", str(p)],
                          work / f"{n}-{k}.log") for n, p in ports.items()}
        try:
            for p in ports.values():
                wait_ready(f"http://127.0.0.1:{p}", "/ready")
            time.sleep(5)  # the gateway's first load reports
            ratios = []
            for j in range(args.pairs):
                tps = {}
                for n in ("A", "B") if j % 2 == 0 else ("B", "A"):
                    seed += 1
                    out = work / f"{n}-{k}-{j}.json"
                    subprocess.run(bench(f"http://127.0.0.1:{ports[n]}", args.gguf, out,
                                         concurrency=args.concurrency, prompts=2 * args.concurrency, seed=seed),
                                   check=True, stdout=subprocess.DEVNULL)
                    tps[n] = summary(out)["output_throughput"]
                ratios.append(tps["B"] / tps["A"])
                print(f"set {k} pair {j}: A {tps['A']:.1f} B ({args.b}) {tps['B']:.1f} tok/s, "
                      f"B / A {ratios[-1]:.3f}", flush=True)
        finally:
            for p in procs.values():
                stop(p)
        medians.append(statistics.median(ratios))
        print(f"set {k}: median B / A {medians[-1]:.3f}", flush=True)
    print("set medians:", ", ".join(f"{m:.3f}" for m in medians))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
