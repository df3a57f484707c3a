"""Could cheaper activation rounding buy batch-64 speed? Quality of the candidates.

    python benchmarks/activation_rounding.py

The int8 format's layer products at 64 rows are compute-bound with two-byte
activations (15 bits per 32 values). Two cheaper roundings would be faster, so this
measures what they cost in quality on the real model, with the measures of
``benchmarks/int8_quality.py`` (perplexity on 3,000 tokens of CPython's LICENSE,
greedy agreement with fp32 on 8 chat prompts × 32 tokens):

1. One-byte activations per 32 values (llama.cpp's Q8 rounding), per layer kind:
   the int8 kernel on every row, ``FINE`` off for the kinds listed.
2. SmoothQuant-style w8a8 (torch's dynamic int8: activations per tensor): per input
   channel, s = max|x|^alpha / max|w|^(1 - alpha) from 2,048 calibration tokens of
   another text shipped with Python (pydoc's topics), W' = W diag(s), x' = x / s.

Writes benchmarks/results/activation_rounding.{md,json}.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's llmserve
sys.path.insert(0, str(Path(__file__).resolve().parent))
from int8_quality import PROMPTS, common_prefix  # noqa: E402

KINDS = ("qkv", "o", "gate_up", "down")
ONE_BYTE = [(), ("gate_up",), ("qkv", "o"), ("qkv", "o", "gate_up"), ("down",), ("head",)]
SMOOTH = [(("qkv", "o", "gate_up"), 0.5), (("qkv", "o", "gate_up"), 0.8), (("qkv", "gate_up"), 0.5),
          (KINDS, 0.5)]


class _Recorder:
    """A linear layer that keeps the running max |x| of each input channel."""

    def __init__(self, inner, store: dict, key) -> None:
        self.inner, self.store, self.key = inner, store, key
        self.out_features, self.in_features = inner.out_features, inner.in_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        a = x.detach().abs().reshape(-1, x.shape[-1]).amax(0)
        self.store[self.key] = torch.maximum(self.store[self.key], a) if self.key in self.store else a
        return self.inner(x)


class _Smoothed:
    """w8a8 on W diag(s), fed x / s."""

    def __init__(self, w: torch.Tensor, x_max: torch.Tensor, alpha: float) -> None:
        from llmserve.models.quant import Int8Linear

        s = (x_max.clamp(min=1e-5) ** alpha / w.abs().amax(0).clamp(min=1e-5) ** (1 - alpha)).clamp(min=1e-5)
        self.inv = (1 / s).contiguous()
        self.q = Int8Linear.from_float(w * s[None, :])
        self.out_features, self.in_features = w.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(x * self.inv)


def main() -> None:
    from llmserve import LLM, SamplingParams
    from llmserve.models.llama import LlamaForCausalLM
    from llmserve.models.model_source import load_weights
    from llmserve.models.perplexity import perplexity
    from llmserve.models.quant import w8a8_factory
    from llmserve.models.store import default_store_dir, resolve
    from llmserve.models.weights import linear_factory_for

    torch.set_num_threads(2)
    w8a8_factory()  # selects torch's quantized engine
    base = LLM("SmolLM2-135M-Instruct", max_num_seqs=8, dtype="fp32")
    tok = base.get_tokenizer()
    ids = tok.encode(Path(os.__file__).with_name("LICENSE.txt").read_text())[:3000]
    calib = tok.encode((Path(os.__file__).parent / "pydoc_data" / "topics.py").read_text()[20000:60000])[:2048]
    mc, w = load_weights(resolve("SmolLM2-135M-Instruct", default_store_dir()), default_store_dir())
    sp = SamplingParams(max_tokens=32, temperature=0)
    chats = [tok.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    ref = [o.token_ids for o in base.generate(chats, sp)]
    rows = []

    def greedy(llm) -> tuple[int, list[int]]:
        outs = [o.token_ids for o in llm.generate(chats, sp)]
        return sum(a == b for a, b in zip(outs, ref)), [common_prefix(a, b) for a, b in zip(outs, ref)]

    # 1. one-byte activations per layer kind (the int8 kernel on every row)
    def every_row(weight):
        layer = linear_factory_for("int8")(weight)
        layer.SMALL_M = 1 << 30
        return layer

    def one_byte(model, kinds) -> None:
        for lay in model.layers:
            for k in KINDS:
                getattr(lay, k).FINE = k not in kinds
        model.lm_head.FINE = "head" not in kinds

    llm = LLM("SmolLM2-135M-Instruct", max_num_seqs=8, dtype="int8")
    for kinds in ONE_BYTE:
        m = LlamaForCausalLM(mc, w, every_row)
        one_byte(m, kinds)
        ppl = perplexity(m, ids, kv_dtype=torch.float16)
        one_byte(llm.engine.model, kinds)
        eq, prefixes = greedy(llm)
        rows.append({"rounding": "one byte per 32", "kinds": list(kinds), "perplexity": ppl, "greedy_equal": eq,
                     "prefixes": prefixes})
        print(rows[-1], flush=True)

    # 2. SmoothQuant-style w8a8
    fp = LlamaForCausalLM(mc, w, linear_factory_for("fp32"))
    x_max: dict = {}
    dense = {(i, k): getattr(lay, k) for i, lay in enumerate(fp.layers) for k in KINDS}
    for (i, k), layer in dense.items():
        setattr(fp.layers[i], k, _Recorder(layer, x_max, (i, k)))
    perplexity(fp, calib)  # the calibration forward
    for (i, k), layer in dense.items():
        setattr(fp.layers[i], k, layer)

    def smooth(model, kinds, alpha) -> None:
        for i, lay in enumerate(model.layers):
            for k in kinds:
                setattr(lay, k, _Smoothed(dense[(i, k)].weight.float(), x_max[(i, k)], alpha))

    for kinds, alpha in SMOOTH:
        m = LlamaForCausalLM(mc, w, linear_factory_for("fp32"))
        smooth(m, kinds, alpha)
        ppl = perplexity(m, ids)
        llm = LLM("SmolLM2-135M-Instruct", max_num_seqs=8, dtype="fp32")
        smooth(llm.engine.model, kinds, alpha)
        eq, prefixes = greedy(llm)
        rows.append({"rounding": f"w8a8 per tensor, smoothed (alpha {alpha})", "kinds": list(kinds),
                     "perplexity": ppl, "greedy_equal": eq, "prefixes": prefixes})
        print(rows[-1], flush=True)

    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "activation_rounding.json").write_text(json.dumps(rows, indent=2))
    lines = ["`python benchmarks/activation_rounding.py` (fp32 reference: perplexity 12.587, greedy 8/8)", "",
             "| activations | layer kinds | perplexity (3,000 tokens) | greedy outputs equal to fp32 | "
             "tokens equal before the first difference |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['rounding']} | {', '.join(r['kinds']) or 'none (two bytes everywhere)'} | "
                     f"{r['perplexity']:.3f} | {r['greedy_equal']}/8 | {' '.join(map(str, r['prefixes']))} |")
    (out / "activation_rounding.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
