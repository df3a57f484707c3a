"""The int8 layer products' rate on the real model, by rows and threads, with and without the
outlier channels the default takes in fp32 beside the integer dot.

    LLMSERVE_NO_VNNI=1 python benchmarks/engine/products_rate.py   # as an AVX2-only CPU runs
    python benchmarks/engine/products_rate.py --rows 16,64,256 --threads 1,2

Every layer product of SmolLM2's 30 layers (qkv, o, gate_up, down) at the default rounding
(one byte), the median of 5 passes, in multiply-adds per second; compare with the one-core
ceiling of the dot alone, ``maddubs_peak.cpp``.
"""

from __future__ import annotations

import argparse
import time

import torch
from common import load


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="16,64,256")
    ap.add_argument("--threads", default="1,2")
    args = ap.parse_args()
    from llmserve.models import kernels

    k = kernels.load()
    model = load().core(dtype="int8", max_num_seqs=64).runner.model
    layers = [getattr(lay, n) for lay in model.layers for n in ("qkv", "o", "gate_up", "down")]
    print(f"VNNI path: {k.int8_vnni_active()}")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for rows in (int(r) for r in args.rows.split(",")):
            xs = {n: torch.randn(rows, n) for n in {lay.in_features for lay in layers}}
            macs = sum(lay.in_features * lay.out_features for lay in layers) * rows
            line = []
            for outliers in (True, False):
                def run() -> None:
                    for lay in layers:
                        p = lay.packed
                        fn = k.q4_linear if p.bits == 4 else k.q8_linear
                        split = lay.outliers if outliers and lay.outliers is not None else (None, None)
                        fn(xs[lay.in_features], p.codes, p.scale, p.offset, lay.out_features, False, *split)
                run()
                times = []
                for _ in range(5):
                    t = time.perf_counter()
                    run()
                    times.append(time.perf_counter() - t)
                t = sorted(times)[2]
                line.append(f"{'with' if outliers else 'without'} outlier channels {t * 1e3:.1f} ms "
                            f"({macs / t / 1e9:.1f} G multiply-adds/s)")
            print(f"{threads} thread(s), {rows} rows: " + "; ".join(line), flush=True)


if __name__ == "__main__":
    main()
