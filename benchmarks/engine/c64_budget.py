"""Where a c = 64 run's time goes, in process: the int8 products' rate per layer kind, then
one run of 64 prompts split into its prefill and decode phases.

    LLMSERVE_NO_VNNI=1 python benchmarks/engine/c64_budget.py   # as an AVX2-only CPU runs

Products: each layer kind of one decoder layer at 64 / 256 / 512 rows, the median of 7
calls, in multiply-adds per second (the engine's threads). Run: 64 prompts of 103 random
token ids, 128 tokens out (``ignore_eos``, greedy), all added at once as ``peers/run.py``'s
c = 64 level sends them; the prefill phase ends when every prompt is computed. Each run's
time is then split by what it ran: attention in decode-only steps and in steps with prefill
rows, the head (final norm and output product), sampling, and the rest (the layers' products,
norms, rope; the scheduler and the outputs' text).
The arithmetic these feed is in ``benchmarks/peers/README.md`` (AVX2 on both sides).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import Counter

import torch
from common import load, prefill_all

import llmserve.models.llama as llama_module
from llmserve.engine.sampling_params import SamplingParams

ATTENTION = llama_module.paged_attention  # (the forward pass looks it up in its module at each call)


def timed(fn, acc: Counter, key):
    """``fn`` adding its wall time to ``acc[key(args)]`` (``key``: a name, or a function of the args)."""
    def g(*args, **kw):
        t = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            acc[key(*args) if callable(key) else key] += time.perf_counter() - t
    return g


def split(acc: Counter, total: float, steps: int) -> str:
    parts = [(k, acc[k]) for k in ("attention, decode steps", "attention, prefill steps", "head", "sampling")]
    parts.append(("the rest", total - sum(v for _, v in parts)))
    return "; ".join(f"{k} {v:.2f} s ({100 * v / total:.0f} %)" for k, v in parts) + f"; {steps} steps"


def products(core, rows: list[int]) -> None:
    layer = core.runner.model.layers[len(core.runner.model.layers) // 2]
    for name in ("qkv", "o", "gate_up", "down"):
        lin = getattr(layer, name)
        for m in rows:
            x = torch.randn(m, lin.in_features)
            for _ in range(3):
                lin(x)
            times = []
            for _ in range(7):
                t = time.perf_counter()
                lin(x)
                times.append(time.perf_counter() - t)
            t = statistics.median(times)
            print(f"{name:8s} {m:4d} rows: {t * 1e3:7.3f} ms, "
                  f"{m * lin.in_features * lin.out_features / t / 1e9:6.1f} G multiply-adds/s", flush=True)


def run(loaded, seed: int, prompts: int, prompt_len: int, output_len: int) -> None:
    core = loaded.core(max_num_seqs=prompts)
    acc: Counter = Counter()
    llama_module.paged_attention = timed(
        ATTENTION, acc, lambda q, kc, vc, meta, *a, **k: "attention, " + (
            "decode steps" if all(g.q_len == 1 for g in meta.groups) else "prefill steps"))
    core.runner.model.compute_logits = timed(core.runner.model.compute_logits, acc, "head")
    core._sample = timed(core._sample, acc, "sampling")
    rng = random.Random(seed)
    sp = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    for i in range(prompts):
        core.add_request(f"r{i}", [rng.randrange(100, 40000) for _ in range(prompt_len)], sp)
    t0 = time.perf_counter()
    steps = prefill_all(core)
    t1 = time.perf_counter()
    decode = 0
    while core.has_unfinished():
        core.step()
        decode += 1
    t2 = time.perf_counter()
    print(f"run (seed {seed}): prefill phase {t1 - t0:.2f} s ({steps} steps), decode phase {t2 - t1:.2f} s "
          f"({decode} steps, {1e3 * (t2 - t1) / max(decode, 1):.1f} ms each), "
          f"{prompts * output_len / (t2 - t0):.1f} tok/s", flush=True)
    print(f"    {split(acc, t2 - t0, steps + decode)}", flush=True)
    llama_module.paged_attention = ATTENTION


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="64,256,512")
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    loaded = load()
    products(loaded.core(max_num_seqs=64), [int(r) for r in args.rows.split(",")])
    for seed in range(args.runs):
        run(loaded, seed, 64, 103, 128)


if __name__ == "__main__":
    main()
