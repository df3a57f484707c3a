"""How much a process competing for a core slows a decode step: the step's time with the
competitor on against off, in turn (ABBA blocks of ``--steps`` steps) in one process.

    LLMSERVE_NO_VNNI=1 python benchmarks/engine/interference.py --batches 16,64 --fraction 0.3
    GOMP_SPINCOUNT=10000 LLMSERVE_NO_VNNI=1 python benchmarks/engine/interference.py   # libgomp's spin

The competitor keeps one core busy ``--fraction`` of the time in 2 ms bursts, as the API
process and a benchmark client do beside the engine on a 2-core machine. A step's threads
meet at the end of every parallel region (~300 a 64-row step), so the step slows by more
than the CPU the competitor takes: the printed factor is on / off.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

from common import load, prefill_all
from offline_throughput import prompts_for  # common puts benchmarks/ on the path

from llmserve.engine.sampling_params import SamplingParams

BURST_S = 0.002


def compete(fraction: float, on, stop) -> None:
    while not stop.is_set():
        if not on.is_set():
            time.sleep(0.001)
            continue
        t = time.perf_counter()
        while time.perf_counter() - t < BURST_S:
            pass
        time.sleep(BURST_S * (1 - fraction) / fraction)


def measure(loaded, batch: int, steps: int, blocks: int, on) -> tuple[float, float]:
    core = loaded.core(max_num_seqs=batch)
    sp = SamplingParams(max_tokens=128 + 2 * steps * blocks + 32, temperature=0, ignore_eos=True)
    for i, p in enumerate(prompts_for(loaded.tokenizer, batch, 128, 0)):
        core.add_request(f"r{i}", p, sp)
    prefill_all(core)
    times: dict[bool, list[float]] = {True: [], False: []}
    for b in range(2 * blocks):
        with_competitor = (b % 4) in (0, 3)
        (on.set if with_competitor else on.clear)()
        core.step()  # the first step after a switch is not timed
        t = time.perf_counter()
        for _ in range(steps):
            core.step()
        times[with_competitor].append((time.perf_counter() - t) / steps * 1e3)
    on.clear()
    return statistics.median(times[False]), statistics.median(times[True])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--fraction", type=float, default=0.3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=10)
    args = ap.parse_args()
    loaded = load()
    on, stop = mp.Event(), mp.Event()
    proc = mp.Process(target=compete, args=(args.fraction, on, stop), daemon=True)
    proc.start()
    try:
        for batch in (int(b) for b in args.batches.split(",")):
            off, with_it = measure(loaded, batch, args.steps, args.blocks, on)
            print(f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', 'default')} batch {batch}: "
                  f"{off:.1f} ms a step alone, {with_it:.1f} ms beside the competitor (x{with_it / off:.2f})",
                  flush=True)
    finally:
        stop.set()
        proc.join()


if __name__ == "__main__":
    main()
