"""A decode step with the fused GeGLU gate and q / k RMSNorm against torch's composite ops.

    LLMSERVE_NO_VNNI=1 python benchmarks/engine/fused_ops_ab.py MODEL [--batch 16]

MODEL: a name in the model store or a local GGUF / HF folder (the families benchmark's
Qwen3- and Gemma-3-shaped files: ``benchmarks/families/run.py --work DIR`` leaves them in
DIR). ``--batch`` prompts of 103 random token ids are prefilled, then blocks of 10 decode
steps alternate between the two forms in one engine (``FusedOps`` as the engine runs, and
its ``gelu_mul`` / ``qk_norm_`` swapped for ``TorchOps``'), 9 blocks each; the medians and
their ratio. Models without q / k norms or GeGLU see no difference (a null check).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from common import load, prefill_all

from llmserve.engine.sampling_params import SamplingParams
from llmserve.models.ops import TorchOps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    core = load(args.model).core(max_num_seqs=args.batch)
    ops, ref = core.runner.model.ops, TorchOps()
    rng = random.Random(0)
    sp = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
    for i in range(args.batch):
        core.add_request(f"r{i}", [rng.randrange(100, 40000) for _ in range(103)], sp)
    prefill_all(core)
    times: dict[str, list[float]] = {"fused": [], "torch": []}
    for block in range(18):
        form = "torch" if block % 2 else "fused"
        if form == "torch":  # instance attributes shadow FusedOps' methods
            ops.gelu_mul, ops.qk_norm_ = ref.gelu_mul, ref.qk_norm_
        else:
            vars(ops).pop("gelu_mul", None)
            vars(ops).pop("qk_norm_", None)
        for _ in range(10):
            t = time.perf_counter()
            core.step()
            times[form].append(time.perf_counter() - t)
    f, r = statistics.median(times["fused"]), statistics.median(times["torch"])
    print(f"{args.model}, batch {args.batch}: fused {f * 1e3:.1f} ms a step, torch {r * 1e3:.1f} ms, "
          f"torch / fused {r / f:.3f}")


if __name__ == "__main__":
    main()
