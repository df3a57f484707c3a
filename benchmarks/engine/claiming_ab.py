"""Kernels' work claimed in chunks by whichever thread is free, against a fixed split (A/B).

    python benchmarks/engine/claiming_ab.py --batches 16,64 --interfere 0,0.2

For each batch size, 128-token prompts are prefilled, then blocks of ``--steps`` decode
steps alternate between the two ways of sharing the kernels' work (``work_claiming``), so
a drift of the host falls on both. ``--interfere F`` runs, beside the engine, a process that
keeps one core busy a fraction F of the time in 2 ms bursts (as the API process and a
client do on a 2-core machine); 0: none. Printed: each setting's median step time and the
ratio fixed / claimed (above 1: claiming is faster).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

from common import load
from offline_throughput import prompts_for

from llmserve.engine.sampling_params import SamplingParams
from llmserve.models import kernels


def interferer(fraction: float, stop) -> None:
    burst = 0.002
    while not stop.is_set():
        t = time.perf_counter()
        while time.perf_counter() - t < burst:
            pass
        time.sleep(burst * (1 - fraction) / fraction)


def run(loaded, batch: int, steps: int, blocks: int) -> dict[bool, list[float]]:
    core = loaded.core(max_num_seqs=batch)
    sp = SamplingParams(max_tokens=128 + steps * blocks * 2 + 16, temperature=0, ignore_eos=True)
    for i, p in enumerate(prompts_for(loaded.tokenizer, batch, 128, 0)):
        core.add_request(f"r{i}", p, sp)
    sch = core.scheduler
    while sch.waiting or any(r.num_computed_tokens < len(r.prompt_token_ids) for r in sch.running):
        core.step()
    module = kernels.load()
    times: dict[bool, list[float]] = {True: [], False: []}
    for b in range(2 * blocks):
        mode = (b % 4) in (0, 3)  # ABBA
        module.work_claiming(mode)
        core.step()  # the first step after a switch is not timed
        t = time.perf_counter()
        for _ in range(steps):
            core.step()
        times[mode].append((time.perf_counter() - t) / steps * 1e3)
    module.work_claiming(True)
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--interfere", default="0,0.2")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=8)
    args = ap.parse_args()
    loaded = load()
    for f in (float(x) for x in args.interfere.split(",")):
        stop = mp.Event()
        proc = mp.Process(target=interferer, args=(f, stop), daemon=True) if f > 0 else None
        if proc:
            proc.start()
        try:
            for batch in (int(x) for x in args.batches.split(",")):
                t = run(loaded, batch, args.steps, args.blocks)
                on, off = statistics.median(t[True]), statistics.median(t[False])
                print(f"interfere {f:.2f} batch {batch:3d}: claimed {on:6.1f} ms, fixed {off:6.1f} ms, "
                      f"fixed / claimed {off / on:.3f}", flush=True)
        finally:
            stop.set()
            if proc:
                proc.join()


if __name__ == "__main__":
    main()
