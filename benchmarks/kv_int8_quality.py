"""Would an int8 KV pool keep quality? An emulation under issue 21's bar, before any kernel.

    python benchmarks/kv_int8_quality.py [--tokens 8000] [--groups 64,32]

The engine's default int8 model (``activation_quality.py``'s ``default`` row: one-byte
activations less the outlier channels, the rescored head) on the same held-out text and
512-token windows, its fp16 KV pool rounded after every write: each key's and value's
``group`` consecutive values of a head to int8 on their absmax (64: one scale a head and token;
32: llama.cpp's q8_0 blocks), and back. Prefill attention reads the pool after the writes,
so every score and weighted sum sees the rounded rows. Bar: against fp32, teacher-forced
top-1 >= 98 % and perplexity within +0.5 %, with the activations' own loss included.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's llmserve
from activation_quality import BAR_PPL, BAR_TOP1, DEFAULT, configure, held_out  # noqa: E402


def rounded(x: torch.Tensor, group: int) -> torch.Tensor:
    """``x`` [..., D] through int8 per ``group`` values on their absmax, back in x's dtype."""
    g = x.float().reshape(*x.shape[:-1], -1, group)
    scale = g.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127
    return (torch.round(g / scale).clamp(-127, 127) * scale).reshape(x.shape).to(x.dtype)


def main() -> None:
    from llmserve.models.llama import LlamaForCausalLM
    from llmserve.models.outliers import calibration_ids
    from llmserve.models.perplexity import teacher_forced
    from llmserve.models.weights import linear_factory_for

    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8000)
    ap.add_argument("--groups", default="64,32")
    args = ap.parse_args()
    torch.set_num_threads(2)
    mc, w, tokenizer, ids = held_out(args.tokens)
    ref_nll, ref_top = teacher_forced(LlamaForCausalLM(mc, w, linear_factory_for("fp32")), ids)
    ref_ppl = math.exp(float(ref_nll.mean()))
    print(f"fp32: perplexity {ref_ppl:.4f} on {len(ref_top)} tokens", flush=True)
    model = LlamaForCausalLM(mc, w, linear_factory_for("int8", exact=True))
    configure(model, DEFAULT[-1], calibration_ids(tokenizer))
    write = model.ops.rope_and_cache_
    for group in [None, *(int(g) for g in args.groups.split(","))]:
        def rope_and_cache_(qkv, positions, rope, kc, vc, slots, *rest, _group=group):
            q = write(qkv, positions, rope, kc, vc, slots, *rest)
            if _group is not None:
                kc[slots] = rounded(kc[slots], _group)
                vc[slots] = rounded(vc[slots], _group)
            return q
        model.ops.rope_and_cache_ = rope_and_cache_
        nll, top = teacher_forced(model, ids, kv_dtype=torch.float16)
        ppl = math.exp(float(nll.mean()))
        agree = float((top == ref_top).double().mean())
        verdict = "meets" if agree >= BAR_TOP1 and ppl / ref_ppl - 1 <= BAR_PPL else "fails"
        print(f"KV pool {'fp16' if group is None else f'int8 per {group}'}: top-1 = fp32 {100 * agree:.2f} %, "
              f"perplexity {ppl:.4f} ({100 * (ppl / ref_ppl - 1):+.2f} %): {verdict} the bar", flush=True)


if __name__ == "__main__":
    main()
