"""Quality of the weight formats on the real model: perplexity and greedy agreement with fp32.

    python benchmarks/int8_quality.py            # 3,000 tokens of CPython's LICENSE text, 8 chat prompts

Formats: fp32; bf16; int8 (llmserve's: 4/8-bit weight codes per 32; up to SMALL_M rows our
kernel quantises the activations per 32 into two bytes, FINE); "int8, one-byte activations"
(the same with FINE off: llama.cpp's int8 activations); w8a8 (int8 weights and per-tensor
dynamic int8 activations: torch's fbgemm kernel). The int8 perplexities force the kernel on
every row (the 512-token windows would otherwise take the exact fp32 path): they measure
what decode steps see. Greedy agreement runs the engine, whose decode steps (and these
short prompts) go through the kernel.

Writes benchmarks/results/int8_quality.{md,json}. The text ships with Python itself,
so every machine scores the same tokens.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's llmserve

PROMPTS = ["What is the capital of France?", "Write a haiku about autumn.", "Explain recursion in one sentence.",
           "List three prime numbers.", "Who wrote Romeo and Juliet?", "Give me a tip for better sleep.",
           "Translate 'good morning' into Spanish.", "What does a CPU do?"]


INT8_FINE = {"int8": True, "int8, fp16 KV cache": True, "int8, one-byte activations": False}
# The KV pool of each format (the engine's default for int8 weights is fp16).
KV = {"int8, fp16 KV cache": "fp16"}


@contextmanager
def activations(fine: bool):
    from llmserve.models.quant import WeightOnlyInt8Linear

    before = WeightOnlyInt8Linear.FINE
    WeightOnlyInt8Linear.FINE = fine
    try:
        yield
    finally:
        WeightOnlyInt8Linear.FINE = before


def main() -> None:
    from llmserve import LLM, SamplingParams
    from llmserve.models.llama import LlamaForCausalLM
    from llmserve.models.perplexity import perplexity
    from llmserve.models.weights import linear_factory_for

    torch.set_num_threads(2)
    base = LLM("SmolLM2-135M-Instruct", max_num_seqs=8, dtype="fp32")
    tok = base.get_tokenizer()
    ids = tok.encode(Path(os.__file__).with_name("LICENSE.txt").read_text())[:3000]
    # The converted fp32 weights, straight from the store's cache.
    from llmserve.models.model_source import load_weights
    from llmserve.models.store import default_store_dir, resolve

    mc, w = load_weights(resolve("SmolLM2-135M-Instruct", default_store_dir()), default_store_dir())

    def kernel_on_every_row(weight):
        layer = linear_factory_for("int8")(weight)
        layer.SMALL_M = 1 << 30
        return layer

    formats = ("fp32", "bf16", "int8", "int8, fp16 KV cache", "int8, one-byte activations", "w8a8")
    rows = {}
    for fmt in formats:
        with activations(INT8_FINE.get(fmt, True)):
            factory = kernel_on_every_row if fmt in INT8_FINE else linear_factory_for(fmt)
            model = LlamaForCausalLM(mc, w, factory)
            t = time.perf_counter()
            kv = torch.float16 if KV.get(fmt) == "fp16" else torch.float32
            rows[fmt] = {"perplexity": perplexity(model, ids, kv_dtype=kv), "seconds": time.perf_counter() - t}
    sp = SamplingParams(max_tokens=32, temperature=0)
    chats = [tok.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    ref = [o.token_ids for o in base.generate(chats, sp)]
    for fmt in formats[1:]:
        with activations(INT8_FINE.get(fmt, True)):
            llm = LLM("SmolLM2-135M-Instruct", max_num_seqs=8, dtype="int8" if fmt in INT8_FINE else fmt,
                      kv_cache_dtype=KV.get(fmt, "fp32"))
            outs = [o.token_ids for o in llm.generate(chats, sp)]
        rows[fmt]["greedy_equal_share"] = sum(a == b for a, b in zip(outs, ref)) / len(ref)
        rows[fmt]["greedy_tokens_before_first_difference"] = [common_prefix(a, b) for a, b in zip(outs, ref)]
    rows["fp32"]["greedy_equal_share"] = 1.0
    rows["fp32"]["greedy_tokens_before_first_difference"] = [len(r) for r in ref]
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "int8_quality.json").write_text(json.dumps(rows, indent=2))
    lines = [("| format | perplexity (3,000 tokens) | vs fp32 | greedy outputs equal to fp32 | "
              "tokens equal before the first difference (of 32, per prompt) |"), "|---|---|---|---|---|"]
    for fmt, r in rows.items():
        prefixes = " ".join(map(str, r["greedy_tokens_before_first_difference"]))
        lines.append(f"| {fmt} | {r['perplexity']:.3f} | {r['perplexity'] / rows['fp32']['perplexity'] - 1:+.2%} | "
                     f"{r['greedy_equal_share']:.0%} | {prefixes} |")
    (out / "int8_quality.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


if __name__ == "__main__":
    main()
