"""Which layer kinds keep quality with one-byte activations? The table behind the default.

    python benchmarks/activation_quality.py [--tokens 4096] [--configs default]

Issue 21's bar, on held-out text (IDLE's NEWS2x.txt, shipped with Python: neither the
perplexity text of ``int8_quality.py`` / ``activation_rounding.py``, CPython's LICENSE, nor
their calibration text, pydoc's topics): against the fp32 model on the same GGUF weights,
teacher-forced top-1 agreement >= 98 % and perplexity within +0.5 %. Every int8 row runs our
kernel on every row count (the 512-token windows are prefill chunks), with the engine's
fp16 KV pool for int8 weights; each configuration rounds the activations of the listed
kinds into one byte per value (per 32 values, llama.cpp's Q8 rounding) and the others into
two. "fp32 activations" is the exact path (fp32 GEMM on the weights the codes hold). A kind
marked ``+`` (``head+``) recomputes its top outputs in fp32 after the one-byte product
(``RESCORED_KINDS``, as the engine does), on seven bits where ``SEVEN_BIT_KINDS`` says; unmarked,
it does not.

Writes benchmarks/results/activation_quality.{md,json}; ``--configs default`` only the
rescored rows and the shipped default, into activation_quality-default.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's llmserve

KINDS = ("qkv", "o", "gate_up", "down", "head")
ONE_BYTE = [(), ("qkv",), ("o",), ("gate_up",), ("down",), ("head",), ("o", "gate_up"), ("o", "down"),
            ("gate_up", "down"), ("o", "gate_up", "down"), ("qkv", "o", "gate_up"), ("qkv", "o", "gate_up", "down"),
            KINDS, ("head+",), ("o", "down", "head+"), ("qkv", "o", "gate_up", "down", "head+", "split")]
# "split": the kinds of outliers.CHANNELS less their outlier channels (calibrated on pydoc's topics)
DEFAULT = [("o", "down"), ("head+",), ("o", "down", "head+"), ("qkv", "o", "gate_up", "down", "head+", "split")]
BAR_TOP1, BAR_PPL = 0.98, 0.005
TEXT = Path(os.__file__).parent / "idlelib" / "NEWS2x.txt"


def configure(model, one_byte: tuple[str, ...] | None, calibration: list[int] | None = None) -> None:
    """The kernel on every row, one-byte activations for ``one_byte`` (``kind+``: its top
    outputs recomputed; ``split``: outlier channels set aside on ``calibration``, the
    engine's default); None: fp32 GEMM on every row."""
    from llmserve.models import outliers
    from llmserve.models.quant import RESCORED_KINDS, SEVEN_BIT_KINDS

    for kind, layers in model.linears_by_kind().items():
        for layer in layers:
            layer.SMALL_M = 0 if one_byte is None else 1 << 30
            rescored = one_byte is not None and f"{kind}+" in one_byte
            layer.FINE = one_byte is None or (kind not in one_byte and not rescored)
            layer.RESCORE = RESCORED_KINDS[kind] if rescored else 0
            layer.ACT_BITS = 7 if rescored and kind in SEVEN_BIT_KINDS and layer.packed.bits == 8 else 8
            layer.outliers = None
    if one_byte is not None and "split" in one_byte:
        outliers.split(model, calibration, {k: n for k, n in outliers.CHANNELS.items() if k in one_byte})


def held_out(tokens: int):
    """SmolLM2's config, weights and tokenizer, and the first ``tokens`` + 1 ids of the held-out text."""
    from llmserve.models.model_source import load_tokenizer, load_weights
    from llmserve.models.store import default_store_dir, resolve

    store = default_store_dir()
    source = resolve("SmolLM2-135M-Instruct", store)
    mc, w = load_weights(source, store)
    tokenizer = load_tokenizer(source, store)
    return mc, w, tokenizer, tokenizer.encode(TEXT.read_text())[:tokens + 1]


def main() -> None:
    from llmserve.models import outliers
    from llmserve.models.llama import LlamaForCausalLM
    from llmserve.models.perplexity import teacher_forced
    from llmserve.models.weights import linear_factory_for

    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--configs", choices=("all", "default"), default="all")
    args = ap.parse_args()
    name = "activation_quality" + ("-default" if args.configs == "default" else "")
    torch.set_num_threads(2)
    mc, w, tokenizer, ids = held_out(args.tokens)
    from llmserve.models.outliers import calibration_ids

    calibration = calibration_ids(tokenizer)
    t0 = time.perf_counter()
    ref_nll, ref_top = teacher_forced(LlamaForCausalLM(mc, w, linear_factory_for("fp32")), ids)
    ref_ppl = math.exp(float(ref_nll.mean()))
    print(f"fp32: perplexity {ref_ppl:.4f} on {len(ref_top)} tokens ({time.perf_counter() - t0:.0f} s)", flush=True)
    model = LlamaForCausalLM(mc, w, linear_factory_for("int8", exact=True))  # exact: the fp32 row
    rows = []
    for one_byte in [None, *(ONE_BYTE if args.configs == "all" else DEFAULT)]:
        configure(model, one_byte, calibration)
        nll, top = teacher_forced(model, ids, kv_dtype=torch.float16)
        ppl = math.exp(float(nll.mean()))
        agree = float((top == ref_top).double().mean())
        rows.append({"activations": "fp32" if one_byte is None else "int8 per 32",
                     "one_byte": list(one_byte or ()), "top1_agreement": agree, "perplexity": ppl,
                     "perplexity_change": ppl / ref_ppl - 1,
                     "meets_bar": agree >= BAR_TOP1 and ppl / ref_ppl - 1 <= BAR_PPL})
        print(rows[-1], flush=True)

    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(
        {"text": TEXT.name, "tokens": len(ref_top), "fp32_perplexity": ref_ppl, "rows": rows}, indent=2))
    lines = [f"`python benchmarks/activation_quality.py --tokens {args.tokens} --configs {args.configs}`: SmolLM2-135M-Instruct Q4_1, "
             f"{len(ref_top)} tokens of Python's idlelib/{TEXT.name} (held out), 512-token windows, the int8 "
             f"kernel on every row, fp16 KV. fp32 reference: perplexity {ref_ppl:.4f}. Bar: top-1 >= 98 %, "
             "perplexity <= +0.5 %. `head+`: one byte on seven bits (`SEVEN_BIT_KINDS`), each row's 8 largest "
             "logits recomputed in fp32.", "",
             "| activations | one byte on | two bytes on | top-1 = fp32 | perplexity | vs fp32 | bar |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        one = r["one_byte"]
        two = "-" if r["activations"] == "fp32" else ", ".join(
            k for k in KINDS if k not in one and f"{k}+" not in one) or "none"
        if "split" in one:
            one = [k for k in one if k != "split"] + ["less " + ", ".join(
                f"{n} outlier channels on {k}" for k, n in outliers.CHANNELS.items())]
        lines.append(f"| {r['activations']} | {', '.join(one) or 'none'} | {two} | {100 * r['top1_agreement']:.2f} % "
                     f"| {r['perplexity']:.4f} | {100 * r['perplexity_change']:+.2f} % | "
                     f"{'meets' if r['meets_bar'] else 'fails'} |")
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
