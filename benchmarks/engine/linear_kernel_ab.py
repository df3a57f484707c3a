"""The int8 layer kernels of two builds, taking turns in one process, on the real model.

    python benchmarks/engine/linear_kernel_ab.py BASELINE_BUILD_FOLDER [THIS_BUILD_FOLDER]

Every layer product of SmolLM2's 30 layers (qkv, o, gate_up, down; the 4- and 8-bit
codes as the int8 format packs them), then the output head (8-bit codes), at 16 and 64
rows, each with the engine's default rounding (one byte, the outlier channels set aside;
``--fine``: two bytes everywhere): the median of 6 alternating rounds per build, and the
ratio. Without the second folder, this checkout's kernels are the other side; both take
the VNNI path or not as this process does (``LLMSERVE_NO_VNNI=1``: AVX2). A revision's
build: in a worktree of it, ``python -c "from llmserve.models import kernels; kernels.load()"``
builds into ``~/.cache/torch_extensions/py311_cpu/llmserve_kernels_<hash>``.
"""

from __future__ import annotations

import sys
import time

import torch
from attention_kernel import load_so
from common import load


def main() -> None:
    from llmserve.models import kernels

    args = [a for a in sys.argv[1:] if a != "--fine"]
    fine = "--fine" in sys.argv
    base = load_so(args[0])
    this = load_so(args[1]) if len(args) > 1 else kernels.load()
    base.int8_vnni(kernels.load().int8_vnni_active())
    this.int8_vnni(kernels.load().int8_vnni_active())
    model = load().core(dtype="int8", max_num_seqs=64).runner.model
    layers = [getattr(lay, k) for lay in model.layers for k in ("qkv", "o", "gate_up", "down")]
    groups = {"layer products": layers, "output head": [model.lm_head]}
    torch.manual_seed(0)
    for (what, chosen), rows in ((g, r) for g in groups.items() for r in (16, 64)):
        xs = {k: torch.randn(rows, k) for k in {lay.in_features for lay in chosen}}

        def run(module) -> None:
            for lay in chosen:
                p = lay.packed
                fn = module.q4_linear if p.bits == 4 else module.q8_linear
                one = not fine and not lay.FINE  # (the head: rescored, one byte from 6 rows)
                split = lay.outliers if one and lay.outliers is not None else (None, None)
                # the head's seven-bit activations where the build has them (before b4c37e3: eight)
                kw = {"bits": lay.ACT_BITS} if one and p.bits == 8 and "bits:" in (fn.__doc__ or "") else {}
                fn(xs[lay.in_features], p.codes, p.scale, p.offset, lay.out_features, not one, *split, **kw)

        times: dict[str, list[float]] = {"baseline": [], "this": []}
        for rnd in range(6):
            pair = [("baseline", base), ("this", this)]
            for name, module in (pair if rnd % 2 else pair[::-1]):
                t = time.perf_counter()
                run(module)
                times[name].append((time.perf_counter() - t) * 1e3)
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        print(f"{rows} rows, {what}: baseline {med['baseline']:.1f} ms, this {med['this']:.1f} ms, "
              f"this / baseline {med['this'] / med['baseline']:.3f}", flush=True)


if __name__ == "__main__":
    main()
