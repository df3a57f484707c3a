"""Where a steady decode step goes, per weight format and batch size, on the real model.

    python benchmarks/engine/decode_step.py                  # int8 and fp32, batches 1, 16, 64
    python benchmarks/engine/decode_step.py --dtypes int8 --batches 1 --steps 60

For each (format, batch): 128-token prompts are prefilled, then ``--steps`` decode
steps are timed as a whole and split into the model's forward, the output head (final
norm + head), the linear layers (all of them, the head included) and sampling.
Decode-only figures: the offline benchmark (``benchmarks/offline_throughput.py``) adds
prefill and the ramp of a run. Results: ``benchmarks/results/decode_step.{md,json}``.
"""

from __future__ import annotations

import argparse
import sys
import time

from common import load, loadavg, machine, md_table, steady_core, write_results


def timed(obj, name: str, acc: dict[str, float], key: str) -> None:
    """Wrap ``obj.name`` so that its wall time adds up in ``acc[key]``."""
    f = getattr(obj, name)

    def g(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            acc[key] += time.perf_counter() - t
    setattr(obj, name, g)


class TimedLinear:
    """A linear layer whose calls add their wall time to ``acc["linear"]``."""

    def __init__(self, inner, acc: dict[str, float]) -> None:
        self.inner, self.acc = inner, acc
        self.out_features, self.in_features = inner.out_features, inner.in_features

    def __call__(self, x):
        t = time.perf_counter()
        try:
            return self.inner(x)
        finally:
            self.acc["linear"] += time.perf_counter() - t


def measure(loaded, dtype: str, batch: int, steps: int, kv: str = "auto") -> dict[str, float]:
    core = steady_core(loaded, batch, steps, dtype=dtype, kv_cache_dtype=kv)
    acc = dict.fromkeys(("forward", "head", "linear", "sample"), 0.0)
    model = core.runner.model
    timed(model, "forward", acc, "forward")
    timed(model, "compute_logits", acc, "head")
    timed(core, "_sample", acc, "sample")
    model.lm_head = TimedLinear(model.lm_head, acc)
    for lay in model.layers:
        lay.qkv, lay.o = TimedLinear(lay.qkv, acc), TimedLinear(lay.o, acc)
        lay.gate_up, lay.down = TimedLinear(lay.gate_up, acc), TimedLinear(lay.down, acc)
    t = time.perf_counter()
    for _ in range(steps):
        core.step()
    total = (time.perf_counter() - t) / steps
    return {"step_ms": total * 1e3, "tok_s": batch / total, "kv_cache_dtype": core.config.kv_cache_dtype,
            **{k + "_ms": v / steps * 1e3 for k, v in acc.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="int8,fp32")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--kv-cache-dtypes", default="auto", help="e.g. auto,fp32: each format with each")
    args = ap.parse_args()
    info = {**machine(), "loadavg_start": loadavg()}
    loaded = load()
    rows, data = [], []
    for dtype in args.dtypes.split(","):
        for kv in args.kv_cache_dtypes.split(","):
            for b in (int(x) for x in args.batches.split(",")):
                r = measure(loaded, dtype, b, args.steps if b < 64 else max(6, args.steps // 5), kv)
                data.append({"dtype": dtype, "batch": b, **r})
                rows.append([dtype, r["kv_cache_dtype"], b, f"{r['step_ms']:.1f}", f"{r['tok_s']:.1f}",
                             f"{r['forward_ms']:.1f}", f"{r['head_ms']:.1f}", f"{r['linear_ms']:.1f}",
                             f"{r['sample_ms']:.2f}"])
                print(rows[-1], flush=True)
    table = md_table(["format", "KV cache", "batch", "step ms", "decode tok/s", "forward ms", "head ms",
                      "linear layers ms (head included)", "sample ms"], rows)
    cmd = "python benchmarks/engine/decode_step.py " + " ".join(sys.argv[1:])
    md, _ = write_results("decode_step", False, cmd.strip(), info, [("Steady decode steps", table)], {"rows": data})
    print(md.read_text())


if __name__ == "__main__":
    main()
