"""The int8 layers' small-M product on the real model: the kernel before and after, and fp32.

Times every linear layer of SmolLM2-135M (30 x qkv, o, gate_up, down and the 49152 x 576
output head; 135 M weights) once per pass, for a few row counts, interleaving the variants
pass by pass in one process:

- fp32 ``F.linear`` on the dense weights (the large-M path);
- old: int8 codes, fp32 activations (``w8_linear`` as of ``--baseline``, built from git
  with its own flags, i.e. single-threaded as it shipped);
- new: packed codes (4-bit for the Q4_1 layers, 8-bit for the Q8_0 head), activations
  quantised per 32 into two bytes, integer dot products, float16 scales (what the layer
  uses); and the same with one-byte activations, with float32 scales, and with 8-bit codes
  everywhere, to price each choice;
- reading the old and the new bytes (a sum over them as int64: this machine's read
  bandwidth, the floor of a memory-bound product) and copying them (memcpy: read + write).

    python benchmarks/engine/int8_kernel.py [--quick] [--threads 1] [--rows 1,4,16,64] [--reps 9]
    python benchmarks/engine/int8_kernel.py --prefill --rows 48,128,256,512 --reps 3   # fp32 vs the kernel

Writes benchmarks/results/int8_kernel[-threadsN][-quick].{md,json} (N when not 1). Ratios are within one run; the
machine is shared, so absolute times move between runs.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from common import ROOT, command_line, load, machine, md_table, write_results

from llmserve.models import kernels
from llmserve.models.linear import DenseLinear
from llmserve.models.llama import LlamaForCausalLM
from llmserve.models.qlayout import PackedWeights, pack
from llmserve.models.quant import Unpacked, quantize_groups

OLD_SOURCE = "llmserve/models/csrc/w8_linear.cpp"
PREFILL = ("fp32 F.linear", "new", "new, one-byte activations",
           "fp32 GEMM on weights unpacked a layer at a time (default prefill)")


def old_kernel(rev: str):
    """``w8_linear`` as it was at ``rev`` (fp32 activations), built once into torch's cache."""
    from torch.utils.cpp_extension import load_inline

    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{OLD_SOURCE}"], capture_output=True, text=True,
                         check=True).stdout
    flags = ["-O3", "-mavx2", "-mfma"]  # the flags it shipped with (no -fopenmp: one thread)
    digest = hashlib.sha256((src + " ".join(flags)).encode()).hexdigest()[:12]
    return load_inline(f"llmserve_w8_baseline_{digest}", cpp_sources=[src], functions=["w8_linear"],
                       extra_cflags=flags, verbose=False)


def model_matrices(m) -> list[torch.Tensor]:
    """The weights of every linear layer, as the model builds them (fused qkv, gate_up)."""
    mats: list[torch.Tensor] = []

    def record(w: torch.Tensor) -> DenseLinear:
        mats.append(w.float().contiguous())
        return DenseLinear(w)

    LlamaForCausalLM(m.model_config, m.weights, record)
    return mats


def nbytes(ts: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="3 passes per variant instead of --reps")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", default="1,4,16,64")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--baseline", default="a4d94cb", help="the commit whose w8_linear is 'old'")
    ap.add_argument("--prefill", action="store_true",
                    help="fp32, the layer's two products (two- and one-byte activations) and unpack + fp32: prefill row counts")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    reps = 3 if args.quick else args.reps
    new_kernel, old = kernels.load(), None if args.prefill else old_kernel(args.baseline)
    assert new_kernel is not None, "the kernels did not build"
    info = machine()
    mats = model_matrices(load())
    layers = []
    for w in mats:
        q, scale, offset = quantize_groups(w)
        layers.append({"dense": w, "old": (q, scale, offset), "new": pack(q, scale, offset),
                       "new fp32 scales": pack(q, scale, offset, fp16=False),
                       "new 8-bit codes": pack(q, scale, offset, four_bit=False)})
    bits = [entry["new"].bits for entry in layers]
    sizes = {"old": nbytes([t for e in layers for t in e["old"]]),
             "new": nbytes([t for e in layers for t in e["new"].tensors().values()]),
             "fp32": nbytes([e["dense"] for e in layers])}
    old_copy = [(t, torch.empty_like(t)) for e in layers for t in e["old"]]
    new_copy = [(t, torch.empty_like(t)) for e in layers for t in e["new"].tensors().values()]
    old_words = [t.contiguous().view(-1).view(torch.int64) for t, _ in old_copy]  # every size is a multiple of 8
    new_words = [t.contiguous().view(-1).view(torch.int64) for t, _ in new_copy]

    def product(p: PackedWeights, fine: bool = True) -> Callable[[torch.Tensor], torch.Tensor]:
        f = new_kernel.q4_linear if p.bits == 4 else new_kernel.q8_linear
        return lambda x: f(x, p.codes, p.scale, p.offset, p.out_features, fine)

    rows_out, data = [], {"bytes": sizes, "bits": {"4": bits.count(4), "8": bits.count(8)}, "rows": {}}
    for m in (int(v) for v in args.rows.split(",")):
        xs = [torch.randn(m, e["dense"].shape[1]) for e in layers]
        variants: dict[str, Callable[[], Any]] = {
            "fp32 F.linear": lambda xs=xs: [F.linear(x, e["dense"]) for x, e in zip(xs, layers)],
            "old: int8 codes, fp32 activations": lambda xs=xs: [old.w8_linear(x, *e["old"]) for x, e in zip(xs, layers)],
        }
        for name, packing, fine in (("new", "new", True), ("new, one-byte activations", "new", False),
                                    ("new, fp32 scales", "new fp32 scales", True),
                                    ("new, 8-bit codes", "new 8-bit codes", True)):
            fs = [product(e[packing], fine) for e in layers]
            variants[name] = lambda fs=fs, xs=xs: [f(x) for f, x in zip(fs, xs)]
        unpacked = Unpacked()
        variants["fp32 GEMM on weights unpacked a layer at a time (default prefill)"] = \
            lambda xs=xs: [unpacked.linear(x, e["new"]) for x, e in zip(xs, layers)]
        variants["read the old bytes"] = lambda: [t.sum() for t in old_words]
        variants["read the new bytes"] = lambda: [t.sum() for t in new_words]
        variants["memcpy of the old bytes"] = lambda: [d.copy_(s) for s, d in old_copy]
        variants["memcpy of the new bytes"] = lambda: [d.copy_(s) for s, d in new_copy]
        if args.prefill:
            variants = {k: v for k, v in variants.items() if k in PREFILL}
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(reps):
            for name, f in variants.items():
                t0 = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        base, fp32 = med.get("old: int8 codes, fp32 activations", float("nan")), med["fp32 F.linear"]
        for name, t in med.items():
            rows_out.append([m, name, t * 1e3, min(times[name]) * 1e3, base / t, fp32 / t])
        data["rows"][m] = {"seconds": times}
    table = md_table(["rows", "variant", "median ms", "min ms", "old / this", "fp32 / this"], rows_out)
    mb = {k: v / 1e6 for k, v in sizes.items()}
    note = (f"{len(layers)} matrices, {bits.count(4)} with 4-bit codes, {bits.count(8)} with 8-bit; bytes streamed "
            f"per pass: old {mb['old']:.1f} MB, new {mb['new']:.1f} MB, fp32 {mb['fp32']:.1f} MB. "
            f"{reps} passes per variant, interleaved; ratios from medians.")
    name = "int8_kernel" + ("-prefill" if args.prefill else "") \
        + (f"-threads{args.threads}" if args.threads != 1 else "")
    md, _ = write_results(name, args.quick, command_line(), info,
                          [("Every linear layer of the model, one pass", note + "\n\n" + table)], data)
    print(note)
    print(table)
    print(f"wrote {md}")


if __name__ == "__main__":
    main()
