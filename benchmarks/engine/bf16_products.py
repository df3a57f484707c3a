"""The layer products of SmolLM2's middle layer three ways, at prefill and decode row counts.

    python benchmarks/engine/bf16_products.py [--rows 64,256,512]

Our int8 kernel as the engine's default runs it (one-byte activations, every row), torch's
fp32 GEMM on the weights the codes hold, and torch's bf16 GEMM on them (oneDNN: Intel AMX
where the CPU has it, ``ONEDNN_VERBOSE=1`` says which), the latter two on weights held
unpacked, the activations' conversions timed. Medians of 9 calls, the engine's threads. A
probe of what a bf16 prefill path could give on an AMX CPU: nothing here is the engine's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from common import load


def median_s(f, n: int = 9) -> float:
    for _ in range(3):
        f()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="64,256,512")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    layer = load().core(max_num_seqs=64).runner.model.layers[15]
    total = {}
    for name in ("qkv", "o", "gate_up", "down"):
        lin = getattr(layer, name)
        w32 = lin.dequantized().float().contiguous()
        w16 = w32.bfloat16()
        for m in rows:
            x = torch.randn(m, lin.in_features)
            small, lin.SMALL_M = lin.SMALL_M, 1 << 30  # the kernel on every row count
            ways = {"kernel": median_s(lambda: lin(x))}
            lin.SMALL_M = small
            ways["fp32"] = median_s(lambda: F.linear(x, w32))
            ways["bf16"] = median_s(lambda: F.linear(x.bfloat16(), w16).float())
            macs = m * lin.in_features * lin.out_features
            print(f"{name:8s} {m:4d} rows: " + ", ".join(
                f"{k} {1e3 * t:6.2f} ms ({macs / t / 1e9:4.0f} G)" for k, t in ways.items()), flush=True)
            for k, t in ways.items():
                total[k, m] = total.get((k, m), 0.0) + t
    for m in rows:
        print(f"one layer at {m} rows: " + ", ".join(f"{k} {1e3 * total[k, m]:.2f} ms" for k in ("kernel", "fp32", "bf16")))


if __name__ == "__main__":
    main()
