"""Quality of the weight formats on the real model: perplexity and greedy agreement with fp32.

    python benchmarks/int8_quality.py            # 3,000 tokens of CPython's LICENSE text, 8 chat prompts

Formats: fp32; bf16; int8 (int8 weights, fp32 activations: llmserve's kernel); w8a8
(int8 weights and per-tensor dynamic int8 activations: torch's fbgemm kernel).

Writes benchmarks/results/int8_quality.{md,json}. The text ships with Python itself,
so every machine scores the same tokens.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

PROMPTS = ["What is the capital of France?", "Write a haiku about autumn.", "Explain recursion in one sentence.",
           "List three prime numbers.", "Who wrote Romeo and Juliet?", "Give me a tip for better sleep.",
           "Translate 'good morning' into Spanish.", "What does a CPU do?"]


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
    from llmserve.models.loading import load_weights
    from llmserve.models.store import default_store_dir, resolve

    mc, w = load_weights(resolve("SmolLM2-135M-Instruct", default_store_dir()), default_store_dir())
    rows = {}
    for fmt in ("fp32", "bf16", "int8", "w8a8"):
        model = LlamaForCausalLM(mc, w, linear_factory_for(fmt))
        t = time.perf_counter()
        rows[fmt] = {"perplexity": perplexity(model, ids), "seconds": time.perf_counter() - t}
    sp = SamplingParams(max_tokens=32, temperature=0)
    ref = [o.token_ids for o in base.generate([tok.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS], sp)]
    for fmt in ("bf16", "int8", "w8a8"):
        llm = LLM("SmolLM2-135M-Instruct", max_num_seqs=8, dtype=fmt)
        outs = [o.token_ids for o in llm.generate([tok.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS], sp)]
        rows[fmt]["greedy_equal_share"] = sum(a == b for a, b in zip(outs, ref)) / len(ref)
    rows["fp32"]["greedy_equal_share"] = 1.0
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "int8_quality.json").write_text(json.dumps(rows, indent=2))
    lines = ["| format | perplexity (3,000 tokens) | vs fp32 | greedy outputs equal to fp32 |", "|---|---|---|---|"]
    for fmt, r in rows.items():
        lines.append(f"| {fmt} | {r['perplexity']:.2f} | {r['perplexity'] / rows['fp32']['perplexity'] - 1:+.1%} | "
                     f"{r['greedy_equal_share']:.0%} |")
    (out / "int8_quality.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
