"""Prefill rows on this CPU: the int8 kernel against fp32 GEMM on unpacked weights, per layer kind.

    python benchmarks/engine/prefill_path.py [--rows 64,128,256,512] [--reps 5] [--threads 2]

For each of SmolLM2's layer kinds (all 30 layers of it, the engine's default activation
rounding) and row count: the kernel with two-byte activations, with one byte, the layer's
own dispatch with its unpack buffer removed (what ``--prefill-weights int8`` runs), and
unpack + fp32 GEMM (``--prefill-weights unpack``), interleaved pass by pass, medians.
Then what ``--prefill-weights auto`` picks here (``llmserve/models/prefill_path.py``).
``LLMSERVE_NO_VNNI=1`` times the AVX2 path on a CPU with AVX-512 VNNI.
Writes benchmarks/results/prefill_path[-novnni].{md,json}.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from common import command_line, load, loadavg, machine, md_table, write_results


def main() -> None:
    from llmserve.models import kernels, prefill_path

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="64,128,256,512")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    kernel = kernels.load()
    info = {**machine(), "loadavg_start": loadavg(), "vnni": kernel.int8_vnni_active()}
    core = load().core(dtype="int8", prefill_weights="unpack", threads=args.threads)
    model = core.model
    timing = prefill_path.measure(model)
    rows_out, data = [], []
    for kind, layers in model.linears_by_kind().items():
        if kind == "head":  # prefill's head sees one row per prompt
            continue
        for m in (int(v) for v in args.rows.split(",")):
            xs = [torch.randn(m, layer.in_features) for layer in layers]

            def product(fine: bool):
                return lambda: [(kernel.q4_linear if lay.packed.bits == 4 else kernel.q8_linear)(
                    x, lay.packed.codes, lay.packed.scale, lay.packed.offset, lay.out_features, fine)
                    for lay, x in zip(layers, xs)]

            def dispatch(unpack: bool):
                def run():
                    for lay, x in zip(layers, xs):
                        buffer = lay.unpacked
                        lay.unpacked = buffer if unpack else None
                        lay(x)
                        lay.unpacked = buffer
                return run

            variants = {"kernel, two bytes": product(True), "kernel, one byte": product(False),
                        "kernel, the layer's rounding (int8)": dispatch(False),
                        "unpack + fp32 GEMM (unpack)": dispatch(True)}
            times = {k: [] for k in variants}
            with torch.inference_mode():
                for _ in range(args.reps):
                    for name, f in variants.items():
                        t0 = time.perf_counter()
                        f()
                        times[name].append(time.perf_counter() - t0)
            med = {k: statistics.median(v) for k, v in times.items()}
            base = med["unpack + fp32 GEMM (unpack)"]
            for name, t in med.items():
                rows_out.append([kind, m, name, f"{t * 1e3:.2f}", f"{t / base:.2f}"])
            data.append({"kind": kind, "rows": m, "seconds": times})
            print(rows_out[-4:], flush=True)
    table = md_table(["kind", "rows", "variant", "median ms (30 layers)", "/ unpack"], rows_out)
    picked = "nothing to choose" if timing is None else (
        f"`--prefill-weights auto` picks **{timing.choice}** here (first layer at {prefill_path.ROWS} rows: "
        f"kernel {timing.kernel_s * 1e3:.1f} ms, unpack + GEMM {timing.unpack_s * 1e3:.1f} ms)")
    name = "prefill_path" + ("-novnni" if os.environ.get("LLMSERVE_NO_VNNI") else "")
    md, _ = write_results(name, False, command_line(), info, [
        ("Prefill products, 30 layers of each kind", f"VNNI path: {info['vnni']}. {picked}.\n\n{table}")],
        {"rows": data, "auto": None if timing is None else vars(timing)})
    print(md.read_text())


if __name__ == "__main__":
    main()
