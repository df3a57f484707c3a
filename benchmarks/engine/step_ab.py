"""Decode steps with two builds of the kernels, taking turns in one process, on the real model.

    LLMSERVE_NO_VNNI=1 python benchmarks/engine/step_ab.py BASELINE_BUILD THIS_BUILD
    python benchmarks/engine/step_ab.py BASE THIS --batches 16,64 --steps 10 --rounds 8 --compete 0.3

Each build gets its own engine core over the same weights and the same prompts; the cores step
in turn (ABBA blocks of ``--steps`` steps) and the median step time of each is compared.
Speculation is off: with it, each core drafts from its own measured step costs, and two cores of
one build drift apart as greedy outputs turn repetitive. ``--compete F`` keeps one core busy
``F`` of the time in 2 ms bursts (``interference.py``'s competitor), as the API process and a
client do beside the engine. A build folder holds one compiled kernels library (``*.so``): a
revision's, as ``linear_kernel_ab.py`` says, or a copy of ``llmserve/models/_kernels*.so``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

from attention_kernel import load_so
from common import load, steady_core
from interference import compete

import llmserve.models.kernels as kernels_module


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("this")
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--compete", type=float, default=0.0)
    args = ap.parse_args()
    original = kernels_module.load
    vnni = original().int8_vnni_active()
    builds = {"base": load_so(args.base), "this": load_so(args.this)}
    for module in builds.values():
        module.int8_vnni(vnni)
    if args.compete > 0:
        on, stop = mp.Event(), mp.Event()
        on.set()
        mp.Process(target=compete, args=(args.compete, on, stop), daemon=True).start()
    loaded = load()
    for batch in (int(b) for b in args.batches.split(",")):
        cores = {}
        for name, module in builds.items():
            kernels_module.load = lambda *a, _m=module, **kw: _m  # the core binds the kernels it sees
            cores[name] = steady_core(loaded, batch, args.rounds * args.steps, speculative_config=None)
        times: dict[str, list[float]] = {name: [] for name in builds}
        for r in range(args.rounds):
            for name in ("base", "this") if r % 4 in (0, 3) else ("this", "base"):
                kernels_module.load = lambda *a, _m=builds[name], **kw: _m  # (attention looks it up per call)
                t = time.perf_counter()
                for _ in range(args.steps):
                    cores[name].step()
                times[name].append((time.perf_counter() - t) / args.steps * 1e3)
        b, t = statistics.median(times["base"]), statistics.median(times["this"])
        pairs = [round(x / y, 3) for x, y in zip(times["this"], times["base"])]
        print(f"batch {batch}: base {b:.1f} ms, this {t:.1f} ms a step: this / base {t / b:.3f} (rounds {pairs})",
              flush=True)
    kernels_module.load = original


if __name__ == "__main__":
    main()
